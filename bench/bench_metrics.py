"""Cost of a Prometheus scrape of nsqd's /metrics next to a /stats?format=json call.

Starts a real nsqd, creates ``--topics`` topics with ``--channels`` channels each, then times
``--scrapes`` GETs of each route and prints the mean per request and the response size.

    .venv/bin/python bench/bench_metrics.py --topics 100 --channels 3 --scrapes 20
"""

from __future__ import annotations

import argparse
import http.client
import tempfile
import time
import urllib.parse

from nsqpy.testing import start_nsqd


def get(address: tuple[str, int], path: str) -> bytes:
    conn = http.client.HTTPConnection(*address, timeout=30)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        body = resp.read()
        assert resp.status == 200, (path, resp.status)
        return body
    finally:
        conn.close()


def post(address: tuple[str, int], path: str, **params: str) -> None:
    conn = http.client.HTTPConnection(*address, timeout=30)
    try:
        conn.request("POST", f"{path}?{urllib.parse.urlencode(params)}")
        conn.getresponse().read()
    finally:
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=100)
    parser.add_argument("--channels", type=int, default=3)
    parser.add_argument("--scrapes", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as data, start_nsqd(data) as nsqd:
        address = nsqd.http_address
        for t in range(args.topics):
            for c in range(args.channels):
                if c == 0:
                    post(address, "/topic/create", topic=f"t{t}")
                post(address, "/channel/create", topic=f"t{t}", channel=f"c{c}")
        for path in ("/metrics", "/stats?format=json"):
            get(address, path)  # warm up
            start = time.perf_counter()
            for _ in range(args.scrapes):
                size = len(get(address, path))
            mean = (time.perf_counter() - start) / args.scrapes
            print(
                f"{path:<20} {args.topics} topics x {args.channels} channels: "
                f"{mean * 1000:8.2f} ms/request  {size:>9,} bytes"
            )


if __name__ == "__main__":
    main()

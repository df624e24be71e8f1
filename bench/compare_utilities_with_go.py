"""Run our utilities and Go's side by side on the same input; print SAME or DIFF per case.

::

    .venv/bin/python bench/compare_utilities_with_go.py --go-bin "$GO_NSQ_BIN"

A manual check (the tests do not need Go): nsq_tail's output bytes, nsq_stat's report, the
bytes nsq_to_nsq's JSON filters re-publish, and the ``--consumer-opt`` error texts and exit
codes. Both tools run against the same nsqpy nsqd; log timestamps are not compared.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

from nsqpy.client import sync
from nsqpy.testing import DaemonProcess, start_nsqd

OPTION_CASES = [
    "max_attempts,70000",
    "read_timeout,10m",
    "lookupd_poll_jitter,2",
    "msg_timeout",
    "msg_timeout,5",
    "sample_rate,x",
    "tls_min_version,x",
    "max_attempts,-1",
    "foo,1",
    "heartbeat_interval,abc",
    "deflate_level,10",
    "max_in_flight,-1",
    "snappy,maybe",
    "snappy",
    "backoff_multiplier,2h",
    "low_rdy_timeout,500ms",
    "lookupd_poll_jitter,abc",
    "tls_root_ca_file,/nonexistent",
    "tls_insecure_skip_verify,yes",
    "output_buffer_size,1.5",
    "max_requeue_delay,61m",
    "default_requeue_delay,-1s",
    "write_timeout,50ms",
    "max_attempts,99999999999999999999",
    "sample_rate,-5",
]


VALIDATION_CASES = [
    ("nsq_tail", ["--topic=t"]),
    ("nsq_tail", ["--topic=t", "--nsqd-tcp-address=a:1", "--lookupd-http-address=b:1"]),
    ("nsq_tail", ["--nsqd-tcp-address=a:1"]),
    ("nsq_tail", ["--topic=t", "--nsqd-tcp-address=127.0.0.1:1"]),
    ("nsq_tail", ["--bogus"]),
    ("nsq_tail", ["--topic=bad topic", "--nsqd-tcp-address=127.0.0.1:1"]),
    ("nsq_tail", ["--topic=t", "--channel=bad/", "--nsqd-tcp-address=127.0.0.1:1"]),
    ("nsq_tail", ["--topic=t", "--consumer-opt=heartbeat_interval,90s", "--nsqd-tcp-address=a:1"]),
    ("nsq_tail", ["-n", "x"]),
    ("to_nsq", ["--nsqd-tcp-address=a:1"]),
    ("to_nsq", ["--topic=t", "--delimiter=ab"]),
    ("to_nsq", ["--topic=t"]),
    ("to_nsq", ["--topic=t", "--nsqd-tcp-address=127.0.0.1:1"]),
    ("nsq_stat", ["--channel=c"]),
    ("nsq_stat", ["--topic=t", "--channel=c", "--interval=0s"]),
    ("nsq_stat", ["--topic=t", "--channel=c", "--count=0"]),
    ("nsq_stat", ["--count=x"]),
    ("nsq_stat", ["--topic=t", "--channel=c"]),
    ("nsq_stat", ["--topic=t", "--channel=c", "--nsqd-http-address=http://a:1"]),
    ("nsq_stat", ["--topic=t", "--channel=c", "--nsqd-http-address=127.0.0.1:1"]),
    ("nsq_to_nsq", ["--nsqd-tcp-address=a:1"]),
    ("nsq_to_nsq", ["--topic=bad topic"]),
    ("nsq_to_nsq", ["--topic=t", "--destination-topic=bad!"]),
    ("nsq_to_nsq", ["--topic=t", "--channel=bad/ch"]),
    ("nsq_to_nsq", ["--topic=t"]),
    ("nsq_to_nsq", ["--topic=t", "--nsqd-tcp-address=a:1"]),
    (
        "nsq_to_nsq",
        ["--topic=t", "--nsqd-tcp-address=127.0.0.1:1", "--destination-nsqd-tcp-address=b:1"],
    ),
]


def validation_case(tool: str, args: list[str]) -> tuple[int, bytes]:
    """Exit code and the last stderr line without Go's log timestamp (the first line for a
    flag error, which is followed by the usage)."""
    result = subprocess.run([tool, *args], input=b"x\n", capture_output=True, timeout=60)
    lines = result.stderr.rstrip(b"\n").split(b"\n")
    line = lines[0] if result.returncode == 2 else lines[-1]
    return result.returncode, line[20:] if line[:2] == b"20" else line


def post(nsqd: DaemonProcess, path: str, body: bytes = b"", **params: str) -> None:
    url = f"{nsqd.http_url}{path}?{urllib.parse.urlencode(params)}"
    urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=10).read()


def tcp(nsqd: DaemonProcess) -> str:
    return "{}:{}".format(*nsqd.tcp_address)


def compare(name: str, ours: bytes | tuple[int, bytes], go: bytes | tuple[int, bytes]) -> bool:
    same = ours == go
    print(f"{'SAME' if same else 'DIFF'} {name}")
    if not same:
        print(f"  nsqpy: {ours!r}\n  Go:    {go!r}")
    return same


def tail_case(nsqd: DaemonProcess, tool: str, tag: str) -> bytes:
    topic = f"cmp_tail_{tag}"
    post(nsqd, "/topic/create", topic=topic)
    for body in (b"plain", b"\x00\x01\xff", b"multi\nline", b"x" * 5000, "é ü".encode()):
        post(nsqd, "/pub", body, topic=topic)
    args = [tool, f"--topic={topic}", f"--nsqd-tcp-address={tcp(nsqd)}", "-n", "5"]
    result = subprocess.run([*args, "--print-topic"], capture_output=True, timeout=60)
    return result.stdout.replace(topic.encode(), b"TOPIC")


def stat_case(nsqd: DaemonProcess, tool: str, tag: str) -> bytes:
    topic = f"cmp_stat_{tag}"
    post(nsqd, "/topic/create", topic=topic)
    post(nsqd, "/channel/create", topic=topic, channel="c")
    for i in range(30):
        post(nsqd, "/pub", b"%d" % i, topic=topic)
    http = "{}:{}".format(*nsqd.http_address)
    args = [f"--topic={topic}", "--channel=c", f"--nsqd-http-address={http}", "--count=3"]
    return subprocess.run([tool, *args, "--interval=100ms"], capture_output=True, timeout=60).stdout


def to_nsq_json_case(nsqd: DaemonProcess, tool: str, tag: str) -> bytes:
    topic, out = f"cmp_json_{tag}", f"cmp_json_out_{tag}"
    bodies = [
        b'{"a":1,"b":"x","c":1.5,"d":{"e":5,"f":1e-7},"g":"<&>\xc3\xa9","h":[1,2.5]}',
        b'{"a":2,"b":"y"}',
        b"not json",
        b'{"b":"x","zz":1}',
        b'{"a":1e21,"b":"x"}',
        b'{"b":"x","a":12345678901234567890}',
    ]
    for body in bodies:
        post(nsqd, "/pub", body, topic=topic)
    args = [
        f"--topic={topic}",
        f"--nsqd-tcp-address={tcp(nsqd)}",
        f"--destination-nsqd-tcp-address={tcp(nsqd)}",
        f"--destination-topic={out}",
        "--require-json-field=b",
        "--require-json-value=x",
        *(f"--whitelist-json-field={f}" for f in "acdgh"),
    ]
    proc = subprocess.Popen([tool, *args], stderr=subprocess.DEVNULL)
    try:
        messages = sync.consume(out, "check", 4, nsqd_tcp_addresses=tcp(nsqd), timeout=30)
    finally:
        proc.terminate()
        proc.wait(30)
    return b"\n".join(sorted(m.body for m in messages))


def option_case(tool: str, value: str) -> tuple[int, bytes]:
    result = subprocess.run([tool, f"--consumer-opt={value}", "--version"], capture_output=True)
    first = result.stderr.split(b"\n")[0] if result.returncode else b"ok"
    return result.returncode, first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--go-bin", default=os.environ.get("GO_NSQ_BIN", "build/go-nsq"))
    args = parser.parse_args()
    go_bin = Path(args.go_bin)
    if not (go_bin / "nsq_tail").exists():
        sys.exit(f"no Go tools in {go_bin}")
    ours_bin = Path(sys.executable).parent
    same = total = 0
    with tempfile.TemporaryDirectory() as folder:
        nsqd = start_nsqd(folder)
        try:
            cases: list[tuple[str, str, Callable[[DaemonProcess, str, str], bytes]]] = [
                ("nsq_tail output bytes", "nsq_tail", tail_case),
                ("nsq_stat report", "nsq_stat", stat_case),
                ("nsq_to_nsq JSON filter output", "nsq_to_nsq", to_nsq_json_case),
            ]
            for name, program, run in cases:
                ours = run(nsqd, str(ours_bin / program), "py")
                go = run(nsqd, str(go_bin / program), "go")
                same += compare(name, ours, go)
                total += 1
                time.sleep(0.1)
        finally:
            nsqd.stop()
    for value in OPTION_CASES:
        ours_opt = option_case(str(ours_bin / "nsq_to_nsq"), value)
        go_opt = option_case(str(go_bin / "nsq_to_nsq"), value)
        same += compare(f"--consumer-opt={value}", ours_opt, go_opt)
        total += 1
    for program, tool_args in VALIDATION_CASES:
        ours_val = validation_case(str(ours_bin / program), tool_args)
        go_val = validation_case(str(go_bin / program), tool_args)
        same += compare(f"{program} {' '.join(tool_args)}", ours_val, go_val)
        total += 1
    print(f"{same} of {total} cases identical")


if __name__ == "__main__":
    main()

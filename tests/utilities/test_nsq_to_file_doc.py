"""The examples of docs/utilities.md for nsq_to_file, nsq_to_http and nsq_pubsub run as written
(ports and the archive directory swapped for free ones) and print what the document says."""

from __future__ import annotations

import re
import shlex
import subprocess
import urllib.request
from pathlib import Path

from nsqpy.testing import start_nsqd, start_nsqlookupd

from ..raw_v2 import free_port, wait_until
from .conftest import DocShell, channel_stats, fenced_blocks, http_post, lookup_producers, tcp

DOC = Path(__file__).resolve().parents[2] / "docs" / "utilities.md"


def test_doc_examples(tmp_path: Path) -> None:
    text = DOC.read_text()
    blocks = fenced_blocks(text[text.index("## nsq_to_file") : text.index("## Checked against")])
    commands = [body.strip() for lang, body in blocks if lang == "sh"]
    outputs = [body for lang, body in blocks if lang == ""]
    archiver, feed, unzip, forwarder, feed_and_tail, bridge, subscribe, publish = commands
    lookupd = start_nsqlookupd()
    (tmp_path / "data").mkdir()
    nsqd = start_nsqd(tmp_path / "data", f"--lookupd-tcp-address={tcp(lookupd)}")
    # utilities.md's earlier examples leave topic "events" on the nsqd, known to nsqlookupd
    http_post(nsqd, "/topic/create", topic="events")
    wait_until(lambda: lookup_producers(lookupd, "events") == 1, 30, "events registered")
    bridge_address = f"127.0.0.1:{free_port()}"
    shell = DocShell(
        nsqd,
        lookupd,
        {"127.0.0.1:8080": bridge_address, "/tmp/archive": str(tmp_path / "archive")},
    )
    localize, run = shell.localize, shell.run

    def background(command: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            ["bash", "-c", "exec " + localize(command)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    running: list[subprocess.Popen[bytes]] = []
    try:
        # nsq_to_file
        running.append(background(archiver))
        wait_until(lambda: channel_stats(nsqd, "events", "nsq_to_file") is not None, 60)
        run(feed)

        def archived() -> bool:
            stats = channel_stats(nsqd, "events", "nsq_to_file")
            return (
                stats is not None
                and stats["message_count"] == 2
                and stats["depth"] == 0
                and stats["in_flight_count"] == 0
            )

        wait_until(archived, 60, "archived")
        running[-1].terminate()
        assert running[-1].wait(30) == 0
        assert run(unzip).decode() == outputs[0]

        # nsq_to_http
        running.append(background(forwarder))
        wait_until(lambda: channel_stats(nsqd, "events", "http") is not None, 60)
        assert run(feed_and_tail) == b"seven\n"

        # nsq_pubsub: the curl lines as plain HTTP requests (the test must not need curl)
        running.append(background(bridge))
        wait_until(lambda: _answers(f"http://{bridge_address}/ping"), 60, "nsq_pubsub up")
        [sub_url] = re.findall(r"'(http://[^']+)'", localize(subscribe))
        with urllib.request.urlopen(sub_url, timeout=30) as stream:
            wait_until(lambda: channel_stats(nsqd, "events", "web") is not None, 60)
            data = shlex.split(publish)[shlex.split(publish).index("-d") + 1].encode()
            [pub_url] = re.findall(r"'(http://[^']+)'", localize(publish))
            urllib.request.urlopen(urllib.request.Request(pub_url, data=data), timeout=30)
            assert stream.readline().decode() == outputs[1]
            with urllib.request.urlopen(f"http://{bridge_address}/stats", timeout=30) as resp:
                stats = resp.read().decode()
        documented = re.escape(outputs[2]).replace("51234", r"\d+").replace("12s", r"\d+s")
        assert re.fullmatch(documented, stats), stats
    finally:
        for process in running:
            if process.poll() is None:
                process.terminate()
                process.wait(30)
        nsqd.stop()
        lookupd.stop()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status == 200
    except OSError:
        return False

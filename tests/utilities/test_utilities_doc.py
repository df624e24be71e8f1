"""The examples in docs/utilities.md run as written (ports swapped for free ones) and print
what the document says they print."""

from __future__ import annotations

import re
import subprocess
import urllib.request
from pathlib import Path

from nsqpy.testing import start_nsqd, start_nsqlookupd

from ..raw_v2 import wait_until
from .conftest import DocShell, channel_stats, fenced_blocks, tcp

DOC = Path(__file__).resolve().parents[2] / "docs" / "utilities.md"


def test_utilities_doc_examples(tmp_path: Path) -> None:
    text = DOC.read_text()
    # the first examples (to_nsq .. nsq_to_nsq); test_nsq_to_file_doc runs the ones after them
    blocks = fenced_blocks(text[: text.index("## nsq_to_file")])
    commands = [body for lang, body in blocks if lang == "sh"]
    outputs = [body for lang, body in blocks if lang == ""]
    startup, to_nsq, tail, stat, bridge, check = commands
    assert "nsqlookupd" in startup and "nsqd" in startup
    lookupd = start_nsqlookupd()
    nsqd = start_nsqd(tmp_path, f"--lookupd-tcp-address={tcp(lookupd)}")
    shell = DocShell(nsqd, lookupd)
    localize, run = shell.localize, shell.run

    copier: subprocess.Popen[bytes] | None = None
    try:
        run(to_nsq)
        assert run(tail).decode() == outputs[0]
        # the curl line as a plain POST (the test must not need curl)
        curl, stat_command = stat.strip().split("\n")
        url = re.search(r"'(http://[^']+)'", curl)
        assert url is not None
        urllib.request.urlopen(urllib.request.Request(localize(url.group(1)), data=b""))
        assert run(stat_command).decode() == outputs[1]
        copier = subprocess.Popen(["bash", "-c", "exec " + localize(bridge.strip())])
        wait_until(
            lambda: channel_stats(nsqd, "events", "copy") is not None,
            what="copy channel",
            timeout=30.0,
        )
        assert run(check) == b"four\n"
    finally:
        if copier is not None:
            copier.terminate()
            assert copier.wait(30) == 0
        nsqd.stop()
        lookupd.stop()

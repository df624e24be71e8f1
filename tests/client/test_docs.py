"""The examples in docs/client.md run, in order, against a real nsqd."""

from __future__ import annotations

import re
from pathlib import Path

from nsqpy.testing import start_nsqd

DOC = Path(__file__).resolve().parents[2] / "docs" / "client.md"


def test_client_doc_examples_run(tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) >= 8
    nsqd = start_nsqd(tmp_path)
    try:
        tcp = "{}:{}".format(*nsqd.tcp_address)
        http = "{}:{}".format(*nsqd.http_address)
        namespace: dict[str, object] = {"__name__": "docs_example"}
        ran = 0
        for block in blocks:
            if "ca.pem" in block:
                continue  # needs a real CA file and host names
            code = (
                block.replace("127.0.0.1:4150", tcp)
                .replace("127.0.0.1:4151", http)
                .replace('"127.0.0.1:4250"', '"127.0.0.1:1"')  # an nsqd that is down
                .replace("asyncio.sleep(5)", "asyncio.sleep(0.3)")
                .replace("/tmp/poison.log", str(tmp_path / "poison.log"))
            )
            exec(compile(code, f"{DOC.name} block {ran}", "exec"), namespace)
            ran += 1
        assert ran >= 8
        printed = namespace  # the examples print; reaching here means none raised
        assert "consumer" in printed
    finally:
        nsqd.stop()

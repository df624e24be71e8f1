"""gnsq and nsqjs, each driven through its script in ``clients/`` as a subprocess.

gnsq needs gevent's monkey-patching and nsqjs needs node, so neither runs in the test's own
process. Both scripts take the same arguments and print one JSON line a delivery
(``{"body", "attempts", "action"}``) and a last ``{"done", "finished"}`` line; see
``clients/gnsq_client.py``.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

CLIENTS = Path(__file__).parent / "clients"
KINDS = ("gnsq", "nsqjs")


@dataclass(frozen=True)
class Delivery:
    body: bytes
    attempts: int
    action: str  # "fin", "req" or "hold"


def command(kind: str) -> list[str]:
    """How to run ``kind``'s script: the venv's python for gnsq, node for nsqjs."""
    if kind == "gnsq":
        return [sys.executable, str(CLIENTS / "gnsq_client.py")]
    node = shutil.which("node")
    if node is None or not (CLIENTS / "node_modules" / "nsqjs").is_dir():
        pytest.fail("nsqjs needs node and tests/interop/clients/node_modules: run `make nsqjs`")
    return [node, str(CLIENTS / "nsqjs_client.js")]


@dataclass
class ScriptClient:
    """One running script: its deliveries as they arrive, its stderr once it ended."""

    kind: str
    proc: asyncio.subprocess.Process
    on_delivery: Callable[[Delivery], None]
    deliveries: list[Delivery] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    stderr: bytes = b""
    pumping: asyncio.Task[None] = field(init=False)  # reads stdout and stderr to their end

    async def _pump(self) -> None:
        assert self.proc.stdout is not None and self.proc.stderr is not None
        errors = asyncio.create_task(self.proc.stderr.read())
        async for line in self.proc.stdout:
            fields = json.loads(line)
            if "body" in fields:
                delivery = Delivery(
                    fields["body"].encode("latin-1"), fields["attempts"], fields["action"]
                )
                self.deliveries.append(delivery)
                self.on_delivery(delivery)
            else:
                self.summary = fields
        self.stderr = await errors

    def release(self) -> None:
        """Let the script finish what it holds (SIGUSR2)."""
        self.proc.send_signal(signal.SIGUSR2)

    async def wait(self, timeout: float) -> int:
        """The script's exit status once it ended by itself (its stdout read to the end)."""
        await asyncio.wait_for(self.pumping, timeout)
        return await asyncio.wait_for(self.proc.wait(), timeout)

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        self.pumping.cancel()

    def explain(self) -> str:
        return f"{self.kind} exited {self.proc.returncode}: {self.summary}\n{self.stderr.decode()}"


async def run_script(
    kind: str, *args: str, on_delivery: Callable[[Delivery], None] = lambda _: None
) -> ScriptClient:
    """Start ``kind``'s script with ``args`` (``read ...`` or ``publish ...``)."""
    proc = await asyncio.create_subprocess_exec(
        *command(kind),
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    client = ScriptClient(kind, proc, on_delivery)
    client.pumping = asyncio.create_task(client._pump())
    return client

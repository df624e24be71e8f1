"""A daemon child process whose listening addresses are learnt from its log."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from ..internal.net import join_host_port

_LISTENING = re.compile(r"INFO: (TCP|HTTP|HTTPS): listening on (\S+)")


def _split_host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


def preferred_port(port: int) -> int:
    """``port`` when it is free on 127.0.0.1, else 0 (any free port): the usual NSQ ports for
    a demo cluster, without failing when something already holds them."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return 0
    return port


class DaemonProcess:
    """One running daemon. ``addresses`` maps ``"TCP"``/``"HTTP"``/``"HTTPS"`` to (host, port).

    ``log_path``: also append the daemon's log to this file. ``new_session``: run it in its own
    session, so a Ctrl-C in the terminal reaches only the parent, which stops it in order.
    """

    def __init__(
        self,
        module: str,
        args: Sequence[str],
        expect: Sequence[str],
        *,
        log_path: Path | None = None,
        new_session: bool = False,
    ) -> None:
        self.module = module
        self.args = list(args)
        self.expect = list(expect)
        self.log_path = log_path
        self.new_session = new_session
        self.addresses: dict[str, tuple[str, int]] = {}
        self.log_lines: list[str] = []
        self.proc: subprocess.Popen[str] | None = None
        self._ready = threading.Event()
        self._log_thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ lifecycle

    def start(self, timeout: float = 15.0) -> DaemonProcess:
        """Start the process and wait until it listens on every ``expect``-ed kind."""
        return self.launch().wait_ready(timeout)

    def launch(self) -> DaemonProcess:
        """Start the process without waiting (then :meth:`wait_ready`), so that several
        daemons can start side by side."""
        if self._log_thread is not None:  # a previous run's reader must not signal this one
            self._log_thread.join(5)
        self.addresses = {}
        self._ready = threading.Event()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            **self.popen_options(),
        )
        self._log_thread = threading.Thread(
            target=self._pump_log, args=(self.proc, self._ready), daemon=True
        )
        self._log_thread.start()
        return self

    def wait_ready(self, timeout: float = 15.0) -> DaemonProcess:
        """Wait for the listening lines; on failure the process is killed and RuntimeError
        carries its log."""
        assert self.proc is not None, "launch() first"
        if not self._ready.wait(timeout):
            self.kill()
            raise RuntimeError(f"{self.module} did not start in {timeout}s:\n{self.log}")
        if len(self.addresses) < len(self.expect):
            # the log ended before every listening line: the daemon is exiting (its stderr
            # closes a moment before it can be reaped, so wait for it rather than poll)
            try:
                code = self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                code = self.proc.returncode
            raise RuntimeError(f"{self.module} exited with {code}:\n{self.log}")
        return self

    def command(self) -> list[str]:
        """The child's argv (a subclass may wrap it, e.g. in ``unshare``)."""
        return [sys.executable, "-m", self.module, *self.args]

    def popen_options(self) -> dict[str, Any]:
        """Extra ``subprocess.Popen`` arguments (a subclass may set e.g. ``preexec_fn``)."""
        return {"start_new_session": True} if self.new_session else {}

    def _pump_log(self, proc: subprocess.Popen[str], ready: threading.Event) -> None:
        assert proc.stderr is not None
        log_file: IO[str] | None = None
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            log_file = open(self.log_path, "a")  # noqa: SIM115 - closed below
        try:
            self._read_log(proc.stderr, ready, log_file)
        finally:
            if log_file is not None:
                log_file.close()
        proc.stderr.close()
        ready.set()  # exited: stop waiting

    def _read_log(self, stream: IO[str], ready: threading.Event, copy: IO[str] | None) -> None:
        for line in stream:
            if copy is not None:
                copy.write(line)
                copy.flush()
            with self._lock:
                self.log_lines.append(line.rstrip("\n"))
            match = _LISTENING.search(line)
            if match and not ready.is_set():
                self.addresses[match.group(1)] = _split_host_port(match.group(2))
                if all(kind in self.addresses for kind in self.expect):
                    ready.set()

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM (a clean shutdown) and wait; SIGKILL if it does not exit in time."""
        return self._signal_and_wait(signal.SIGTERM, timeout)

    def kill(self) -> int | None:
        return self._signal_and_wait(signal.SIGKILL, 10.0)

    def _signal_and_wait(self, sig: int, timeout: float) -> int | None:
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout)
        return proc.returncode

    def restart(self, timeout: float = 15.0) -> DaemonProcess:
        self.stop()
        return self.start(timeout)

    def __enter__(self) -> DaemonProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------ addresses

    @property
    def log(self) -> str:
        with self._lock:
            return "\n".join(self.log_lines)

    @property
    def tcp_address(self) -> tuple[str, int]:
        return self.addresses["TCP"]

    @property
    def http_address(self) -> tuple[str, int]:
        return self.addresses["HTTP"]

    @property
    def tcp_port(self) -> int:
        return self.tcp_address[1]

    @property
    def http_port(self) -> int:
        return self.http_address[1]

    @property
    def tcp(self) -> str:
        """The TCP address as ``host:port`` text."""
        return join_host_port(*self.tcp_address)

    @property
    def http(self) -> str:
        """The HTTP address as ``host:port`` text."""
        return join_host_port(*self.http_address)

    @property
    def http_url(self) -> str:
        host, port = self.http_address
        return f"http://{host}:{port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid


def start_nsqd(
    data_path: str | Path, *args: str, timeout: float = 15.0, https: bool = False
) -> DaemonProcess:
    """Start ``nsqd`` on free loopback ports with ``data_path``; extra Go-style flags in args.

    With ``https`` it also waits for the HTTPS listener (pass ``--https-address`` and TLS flags).
    """
    base = [
        "--tcp-address=127.0.0.1:0",
        "--http-address=127.0.0.1:0",
        f"--data-path={data_path}",
        "--broadcast-address=127.0.0.1",
    ]
    expect = ["TCP", "HTTP", "HTTPS"] if https else ["TCP", "HTTP"]
    return DaemonProcess("nsqpy.nsqd", [*base, *args], expect).start(timeout)


def start_nsqlookupd(*args: str, timeout: float = 15.0) -> DaemonProcess:
    base = [
        "--tcp-address=127.0.0.1:0",
        "--http-address=127.0.0.1:0",
        "--broadcast-address=127.0.0.1",
    ]
    return DaemonProcess("nsqpy.nsqlookupd", [*base, *args], ["TCP", "HTTP"]).start(timeout)


def start_nsqadmin(*args: str, timeout: float = 15.0) -> DaemonProcess:
    """Start ``nsqadmin`` on a free loopback port; pass ``--lookupd-http-address=...`` or
    ``--nsqd-http-address=...`` (and any other Go-style flags) in ``args``."""
    base = ["--http-address=127.0.0.1:0"]
    return DaemonProcess("nsqpy.nsqadmin", [*base, *args], ["HTTP"]).start(timeout)

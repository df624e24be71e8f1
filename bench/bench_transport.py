"""What TLS, snappy and deflate cost: PUB and SUB throughput per transport, in one run.

    python bench/bench_transport.py --messages 200000 --size 200 --body text

Starts a fresh nsqd (TLS configured with a throwaway CA made by ``openssl``) and, for each
transport (plain, tls, snappy, deflate, tls+snappy, tls+deflate by default; ``--modes``),
publishes ``--messages`` messages with MPUB batches over that transport, then consumes them
like bench_reader (RDY ``--rdy``, a FIN per message, FINs of one read in one write). Prints one
line per transport and phase in bench_writer/bench_reader's format, then a summary table.

The client is one Python process on the other core, so for compressed transports part of what
is measured is the client's own (de)compression; ``--body`` picks how compressible the bodies
are: ``text`` (JSON-like, about 3:1), ``random`` (incompressible) or ``zeros``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from _common import report
from nsqpy.protocol import commands
from nsqpy.protocol.compression import (
    DeflateReader,
    DeflateWriter,
    SnappyFrameReader,
    SnappyFrameWriter,
)
from nsqpy.testing import start_nsqd

_HEADER = struct.Struct(">ii")
MODES = ["plain", "tls", "snappy", "deflate", "tls+snappy", "tls+deflate"]
#: plain bytes handed to the frame parser per decompress call (like nsqd's own reader)
_SLICE = 256 * 1024


def make_certs(directory: Path) -> tuple[Path, Path, Path]:
    """(ca.pem, server.pem, server.key): EC P-256, server valid for 127.0.0.1."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    for key in ("ca.key", "server.key"):
        openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", key)
    openssl("req", "-x509", "-new", "-key", "ca.key", "-out", "ca.pem", "-days", "1",
            "-subj", "/CN=bench CA")  # fmt: skip
    openssl("req", "-new", "-key", "server.key", "-out", "server.csr", "-subj", "/CN=localhost")
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.pem", "-days", "1",
            "-extfile", "san.ext")  # fmt: skip
    return directory / "ca.pem", directory / "server.pem", directory / "server.key"


def make_bodies(kind: str, size: int, count: int) -> list[bytes]:
    rng = random.Random(42)
    if kind == "zeros":
        return [bytes(size)] * count
    if kind == "random":
        return [rng.randbytes(size) for _ in range(min(count, 1000))]
    bodies = []
    for i in range(min(count, 1000)):
        record = {
            "id": i,
            "user": f"user{rng.randrange(10_000)}",
            "event": rng.choice(["click", "view", "purchase", "signup"]),
            "ts": 1_700_000_000 + rng.randrange(1_000_000),
            "path": "/" + "/".join(rng.choice(["a", "shop", "items", "cart"]) for _ in range(3)),
        }
        text = json.dumps(record).encode()
        bodies.append((text * (size // len(text) + 1))[:size])
    return bodies


class Transport:
    """A blocking client connection with the negotiated layers (TLS, then compression)."""

    def __init__(self, address: tuple[str, int], mode: str, ca: Path, name: str) -> None:
        self.sock: socket.socket = socket.create_connection(address)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.compress: Callable[[bytes], bytes] | None = None
        self.reader: SnappyFrameReader | DeflateReader | None = None
        settings = {
            "client_id": name,
            "hostname": name,
            "user_agent": "bench_transport/nsqpy",
            "feature_negotiation": True,
            "tls_v1": "tls" in mode,
            "snappy": "snappy" in mode,
            "deflate": "deflate" in mode,
            "output_buffer_timeout": 25,
        }
        self.sock.sendall(b"  V2" + commands.identify(settings))
        response = json.loads(self.read_frame()[1])
        if response["tls_v1"]:
            context = ssl.create_default_context(cafile=str(ca))
            self.sock = context.wrap_socket(self.sock, server_hostname="127.0.0.1")
            self.expect_ok()
        if response["snappy"]:
            self.start_compression(SnappyFrameWriter().compress, SnappyFrameReader())
        if response["deflate"]:
            self.start_compression(
                DeflateWriter(response["deflate_level"]).compress, DeflateReader()
            )

    def start_compression(
        self, compress: Callable[[bytes], bytes], reader: SnappyFrameReader | DeflateReader
    ) -> None:
        """Bytes after the last plain frame may already be here: they are compressed."""
        self.compress, self.reader = compress, reader
        leftover = bytes(self.buf)
        self.buf.clear()
        self.buf += reader.decompress(leftover, _SLICE)
        self.expect_ok()

    def send(self, data: bytes) -> None:
        self.sock.sendall(self.compress(data) if self.compress else data)

    def fill(self) -> bool:
        """Read once; False at EOF."""
        reader = self.reader
        if reader is not None and reader.pending:
            self.buf += reader.decompress(b"", _SLICE)
            return True
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            return False
        self.buf += reader.decompress(chunk, _SLICE) if reader is not None else chunk
        return True

    def read_frame(self) -> tuple[int, bytes]:
        while True:
            if len(self.buf) >= 8:
                size, frame_type = _HEADER.unpack_from(self.buf)
                if len(self.buf) >= 4 + size:
                    data = bytes(self.buf[8 : 4 + size])
                    del self.buf[: 4 + size]
                    if frame_type == 0 and data == b"_heartbeat_":
                        self.send(b"NOP\n")
                        continue
                    return frame_type, data
            if not self.fill():
                raise ConnectionError("nsqd closed the connection")

    def expect_ok(self) -> None:
        frame = self.read_frame()
        if frame != (0, b"OK"):
            raise RuntimeError(f"expected OK, got {frame!r}")

    def close(self) -> None:
        self.sock.close()


def publish(t: Transport, topic: str, bodies: list[bytes], count: int, batch: int) -> float:
    """MPUB ``count`` messages, one batch outstanding; returns seconds."""
    commands_ = [
        commands.mpub(topic, [bodies[(i + j) % len(bodies)] for j in range(batch)])
        for i in range(0, min(count, len(bodies) * 4), batch)
    ]
    began = time.perf_counter()
    sent = 0
    while sent < count:
        t.send(commands_[(sent // batch) % len(commands_)])
        frame_type, data = t.read_frame()
        if frame_type != 0:
            raise RuntimeError(data.decode())
        sent += batch
    return time.perf_counter() - began


def consume(t: Transport, topic: str, count: int, rdy: int, timeout: float) -> tuple[int, float]:
    """SUB, RDY, FIN every message until ``count`` arrived; returns (count, seconds)."""
    t.send(commands.sub(topic, "bench"))
    t.expect_ok()
    t.send(commands.rdy(rdy))
    t.sock.settimeout(1.0)
    received = 0
    began = time.perf_counter()
    deadline = began + timeout
    unpack = _HEADER.unpack_from
    while received < count and time.perf_counter() < deadline:
        try:
            if not t.fill():
                break
        except TimeoutError:
            continue
        buf = t.buf
        pos, end = 0, len(buf)
        fins = []
        while end - pos >= 8:
            size, frame_type = unpack(buf, pos)
            stop = pos + 4 + size
            if stop > end:
                break
            if frame_type == 2:
                fins.append(b"FIN " + bytes(buf[pos + 18 : pos + 34]) + b"\n")
            elif frame_type == 1:
                raise RuntimeError(bytes(buf[pos + 8 : stop]).decode())
            elif buf[pos + 8 : stop] == b"_heartbeat_":
                fins.append(b"NOP\n")
            pos = stop
        del buf[:pos]
        if fins:
            received += len(fins)
            t.send(b"".join(fins))
    return received, time.perf_counter() - began


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (/proc/<pid>/stat utime and stime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_mode(
    address: tuple[str, int],
    ca: Path,
    mode: str,
    args: argparse.Namespace,
    bodies: list[bytes],
    nsqd_pid: int,
) -> dict[str, float]:
    topic = "bench_" + mode.replace("+", "_")
    count = args.messages - args.messages % args.batch_size
    consumer = Transport(address, mode, ca, "reader")  # the channel exists before publishing
    consumer.send(commands.sub(topic, "bench"))
    consumer.expect_ok()
    producer = Transport(address, mode, ca, "writer")
    cpu = cpu_seconds(nsqd_pid)
    pub_seconds = publish(producer, topic, bodies, count, args.batch_size)
    pub_cpu = cpu_seconds(nsqd_pid) - cpu
    producer.close()
    report(f"{mode} PUB", count, pub_seconds, args.size)
    consumer.close()
    consumer = Transport(address, mode, ca, "reader")
    cpu = cpu_seconds(nsqd_pid)
    received, sub_seconds = consume(consumer, topic, count, args.rdy, args.timeout)
    sub_cpu = cpu_seconds(nsqd_pid) - cpu
    consumer.close()
    report(f"{mode} SUB", received, sub_seconds, args.size)
    if received < count:
        print(f"[{mode}] only {received} of {count} messages arrived", file=sys.stderr)
    return {
        "pub": count / pub_seconds,
        "sub": received / sub_seconds if sub_seconds else 0.0,
        "pub_cpu_us": pub_cpu * 1e6 / count,
        "sub_cpu_us": sub_cpu * 1e6 / max(received, 1),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000, help="messages per transport")
    parser.add_argument("--size", type=int, default=200, help="bytes per message")
    parser.add_argument("--batch-size", type=int, default=200, help="messages per MPUB")
    parser.add_argument("--rdy", type=int, default=2500)
    parser.add_argument("--body", choices=["text", "random", "zeros"], default="text")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated transports")
    parser.add_argument("--timeout", type=float, default=120.0, help="max seconds per SUB phase")
    parser.add_argument("--nsqd-args", default="", help="extra nsqd flags, space-separated")
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = set(modes) - set(MODES)
    if unknown:
        parser.error(f"unknown modes {sorted(unknown)}; choose from {MODES}")
    bodies = make_bodies(args.body, args.size, args.messages)
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        certs = Path(tmp) / "certs"
        certs.mkdir()
        ca, cert, key = make_certs(certs)
        flags = [
            f"--tls-cert={cert}",
            f"--tls-key={key}",
            "--https-address=",
            f"--mem-queue-size={args.messages + 1}",
            *args.nsqd_args.split(),
        ]
        data = Path(tmp) / "data"
        data.mkdir()
        nsqd = start_nsqd(data, *flags)
        try:
            for mode in modes:
                results[mode] = run_mode(nsqd.tcp_address, ca, mode, args, bodies, nsqd.pid)
        finally:
            nsqd.stop()
    print(f"\n{args.messages} x {args.size}-byte {args.body} messages per transport")
    print("(msgs/s; nsqd CPU = nsqd's own user+system time per message, in microseconds)")
    header = ("transport", "PUB msgs/s", "SUB msgs/s", "SUB vs plain", "nsqd CPU PUB", "SUB")
    print("{:<13}{:>12}{:>12}{:>14}{:>14}{:>8}".format(*header))
    plain = results.get("plain", {}).get("sub", 0.0)
    for mode, f in results.items():
        ratio = f"{f['sub'] / plain:.2f}x" if plain else "-"
        print(
            f"{mode:<13}{f['pub']:>12,.0f}{f['sub']:>12,.0f}{ratio:>14}"
            f"{f['pub_cpu_us']:>14.2f}{f['sub_cpu_us']:>8.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Publish load like Go's bench_writer: MPUB batches, one outstanding per worker.

    python bench/bench_writer.py --runfor 10s --nsqd-tcp-address 127.0.0.1:4150 --size 200 \
        --batch-size 200

Prints ``[bench_writer] duration: ... - <MB/s>mb/s - <msgs/s>ops/s - <us/op>us/op``.
"""

from __future__ import annotations

import socket
import struct
import sys
import time
from typing import Any

from _common import base_parser, go_style_args, parse_duration, report, run_workers
from nsqpy.protocol import commands


def _read_frame(sock: socket.socket, buf: bytearray) -> tuple[int, bytes]:
    while True:
        if len(buf) >= 8:
            size, frame_type = struct.unpack_from(">ii", buf)
            if len(buf) >= 4 + size:
                data = bytes(buf[8 : 4 + size])
                del buf[: 4 + size]
                return frame_type, data
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("nsqd closed the connection")
        buf += chunk


def pub_worker(
    runfor: float, address: str, topic: str, size: int, batch: int, start: Any, results: Any
) -> None:
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    identify = {"client_id": "writer", "hostname": "writer", "user_agent": "bench_writer/nsqpy"}
    sock.sendall(b"  V2" + commands.identify(identify))
    buf = bytearray()
    _read_frame(sock, buf)
    command = commands.mpub(topic, [b"a" * size] * batch)
    start.wait()
    began = time.perf_counter()
    deadline = began + runfor
    count = 0
    while time.perf_counter() < deadline:
        sock.sendall(command)
        frame_type, data = _read_frame(sock, buf)
        if frame_type == 1:
            raise RuntimeError(data.decode())
        count += batch
    results.put((count, time.perf_counter() - began))
    sock.close()


def main(argv: list[str]) -> int:
    parser = base_parser("NSQ publish benchmark (bench_writer semantics)")
    parser.add_argument("--batch-size", type=int, default=200, help="messages per MPUB")
    args = parser.parse_args(go_style_args(argv))
    runfor = parse_duration(args.runfor)
    count, seconds = run_workers(
        args.workers,
        pub_worker,
        (runfor, args.nsqd_tcp_address, args.topic, args.size, args.batch_size),
    )
    report("bench_writer", count, seconds, args.size)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

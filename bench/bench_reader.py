"""Consume load like Go's bench_reader: SUB, RDY 2500, FIN every message.

    python bench/bench_reader.py --runfor 10s --nsqd-tcp-address 127.0.0.1:4150 --rdy 2500

FINs for all messages in one received chunk go out in one write (Go's reader flushes its
bufio writer every ~195 FINs). Prints the same line format as bench_writer.
"""

from __future__ import annotations

import socket
import struct
import sys
import time
from typing import Any

from _common import base_parser, go_style_args, parse_duration, report, run_workers
from nsqpy.protocol import commands

_HEADER = struct.Struct(">ii")


def sub_worker(
    runfor: float, address: str, topic: str, channel: str, rdy: int, start: Any, results: Any
) -> None:
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    identify = {"client_id": "reader", "hostname": "reader", "user_agent": "bench_reader/nsqpy"}
    sock.sendall(b"  V2" + commands.identify(identify) + commands.sub(topic, channel))
    start.wait()
    sock.sendall(commands.rdy(rdy))
    sock.settimeout(0.5)
    buf = bytearray()
    count = 0
    responses = 0
    began = time.perf_counter()
    deadline = began + runfor
    unpack = _HEADER.unpack_from
    while time.perf_counter() < deadline:
        try:
            chunk = sock.recv(1 << 20)
        except TimeoutError:
            continue
        if not chunk:
            break
        buf += chunk
        pos = 0
        end = len(buf)
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
            else:
                responses += 1
                if buf[pos + 8 : stop] == b"_heartbeat_":
                    fins.append(b"NOP\n")
            pos = stop
        del buf[:pos]
        if fins:
            count += len(fins)
            sock.sendall(b"".join(fins))
    results.put((count, time.perf_counter() - began))
    sock.close()


def main(argv: list[str]) -> int:
    parser = base_parser("NSQ consume benchmark (bench_reader semantics)")
    parser.add_argument("--channel", default="ch")
    parser.add_argument("--rdy", type=int, default=2500)
    args = parser.parse_args(go_style_args(argv))
    runfor = parse_duration(args.runfor)
    count, seconds = run_workers(
        args.workers,
        sub_worker,
        (runfor, args.nsqd_tcp_address, args.topic, args.channel, args.rdy),
    )
    report("bench_reader", count, seconds, args.size)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

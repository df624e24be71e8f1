"""Bad input on a replication link (the ``  R1`` side of the client port) never crashes a
replicated nsqd nor disturbs what it serves: random bytes, frames out of order, a HELLO
that is not JSON, events that do not decode. Each such link is closed, the node goes on
taking publishes, and a well-formed owner that links afterwards is stored as before."""

from __future__ import annotations

import json
import random
import socket
import struct
from pathlib import Path

from nsqpy.protocol import replica as r1
from nsqpy.protocol.replica import Puts
from nsqpy.testing import DaemonProcess, start_nsqd

from ..raw_v2 import NsqConn, free_port, http_request, pub_cmd, unique, wait_until

RANDOM_LINKS = 25
SEED = 20261127  # the random choices are the same in every run
#: the node's two peers, which nothing listens on: the test speaks as their inbound links,
#: the bad ones as OWNER, the well-formed one at the end as WELL_FORMED
OWNER = f"127.0.0.1:{free_port()}"
WELL_FORMED = f"127.0.0.1:{free_port()}"


def frame(frame_type: int, payload: bytes) -> bytes:
    return r1.FRAME_HEAD.pack(len(payload) + 1, frame_type) + payload


def hello(owner: str = OWNER) -> bytes:
    return r1.hello({"node": owner, "incarnation": "fake", "node_id": 999})


def one_puts(topic: str) -> bytes:
    body = b"hello"
    record = r1.RECORD_HEAD.pack(r1.RECORD_FIXED + len(body), 1, 0, b"0" * 16) + body
    return r1.events(1, [Puts(topic, record, ("ch",))])


BAD_STREAMS = [
    r1.events(1, []),  # EVENTS before HELLO
    frame(r1.FRAME_HELLO, b"{not json"),
    frame(r1.FRAME_HELLO, b'{"node": 7}'),  # no node and incarnation
    hello() + frame(r1.FRAME_EVENTS, struct.pack(">Q", 1) + b"\xff\xff\xff\xff"),
    hello() + frame(r1.FRAME_EVENTS, struct.pack(">Q", 0)),  # sequence numbers start at 1
    hello() + frame(99, b"?"),  # an unknown frame type
    frame(r1.FRAME_ACK, struct.pack(">Q", 1)),  # an ACK is not inbound
]


def random_stream(rng: random.Random) -> bytes:
    """Random bytes; a frame of a known type with a random payload; or a well-formed HELLO
    and PUTS with a few bytes flipped after the HELLO."""
    kind = rng.randrange(3)
    if kind == 0:
        return rng.randbytes(rng.randint(1, 300))
    if kind == 1:
        return frame(rng.randint(1, 6), rng.randbytes(rng.randint(0, 300)))
    good = hello() + one_puts(unique("mutated"))
    mutated = bytearray(good)
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(len(hello()), len(mutated))
        mutated[at] = rng.randrange(256)
    return bytes(mutated)


def send_link(node: DaemonProcess, stream: bytes) -> bytes:
    """One link: the magic and ``stream``, then everything the node answers until it
    closes the link (it must, for these inputs, or at our end of input)."""
    with socket.create_connection(node.tcp_address, timeout=10) as sock:
        sock.sendall(r1.MAGIC_R1 + stream)
        sock.shutdown(socket.SHUT_WR)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
        return received


def held_copies(node: DaemonProcess, owner: str) -> int:
    stats = json.loads(http_request(node, "GET", "/stats?format=json").body)
    [count] = [p["held_copies"] for p in stats["replication"]["peers"] if p["address"] == owner]
    assert isinstance(count, int)
    return count


def still_serving(node: DaemonProcess) -> None:
    assert node.proc is not None and node.proc.poll() is None, node.log
    conn = NsqConn(node.tcp_address)
    conn.send(pub_cmd(unique("after"), b"x"))
    conn.expect_ok()
    conn.close()


def test_bad_links_are_closed_and_the_node_goes_on(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    node = start_nsqd(
        tmp_path,
        f"--replica-peer={OWNER}",
        f"--replica-peer={WELL_FORMED}",
        "--replica-acks=1",
        "--node-id=3",
    )
    try:
        for stream in BAD_STREAMS:
            send_link(node, stream)
            still_serving(node)
        wait_until(
            lambda: node.log.count("REPLICA: inbound link closed") == len(BAD_STREAMS),
            10,
            "each bad link closed with its error logged",
        )
        for _ in range(RANDOM_LINKS):
            send_link(node, random_stream(rng))
        still_serving(node)

        topic = unique("owned")
        answer = send_link(node, hello(WELL_FORMED) + one_puts(topic))
        assert answer[4] == r1.FRAME_WELCOME and answer.endswith(r1.ack(1)), answer
        wait_until(
            lambda: held_copies(node, WELL_FORMED) == 1, 10, "the well-formed owner's copy held"
        )
        assert "Traceback" not in node.log
    finally:
        node.kill()

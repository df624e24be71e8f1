"""Garbage on nsqlookupd's TCP and HTTP ports never takes it down, never leaves an unhandled
exception in its log, and never disturbs a well-behaved nsqd connection."""

from __future__ import annotations

import http.client
import json
import random
import socket
import struct
import time
from collections.abc import Iterator

import pytest

from nsqpy.testing import DaemonProcess, start_nsqlookupd

SEEDS = range(160)
IDENTIFY_BODY = b'{"broadcast_address":"w","http_port":1,"tcp_port":2,"version":"v"}'
IDENTIFY = b"IDENTIFY\n" + struct.pack(">i", len(IDENTIFY_BODY)) + IDENTIFY_BODY
WORDS = [b"IDENTIFY", b"REGISTER", b"UNREGISTER", b"PING", b"", b"t", b"t c", b"#ephemeral"]


@pytest.fixture(scope="module")
def lookupd() -> Iterator[DaemonProcess]:
    with start_nsqlookupd() as proc:
        yield proc


def read_until_closed(sock: socket.socket, limit: float = 3.0) -> bytes:
    data = b""
    deadline = time.monotonic() + limit
    sock.settimeout(limit)
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    else:
        raise AssertionError(f"connection not closed within {limit}s after {data[:200]!r}")
    return data


def split_replies(data: bytes) -> list[bytes]:
    """nsqlookupd's replies are back-to-back ``BE32(len) data``; anything else is a defect."""
    replies = []
    pos = 0
    while pos < len(data):
        assert len(data) - pos >= 4, f"truncated header in {data!r}"
        (size,) = struct.unpack_from(">i", data, pos)
        assert 0 <= size <= len(data) - pos - 4, f"bad size {size} in {data!r}"
        replies.append(data[pos + 4 : pos + 4 + size])
        pos += 4 + size
    return replies


def tcp_payload(rng: random.Random) -> bytes:
    kind = rng.randrange(5)
    noise = rng.randbytes(rng.randrange(0, 600))
    if kind == 0:
        return noise
    if kind == 1:
        return b"  V1" + noise
    if kind == 2:
        size = rng.choice([-(2**31), -1, 0, 3, 100, 2**31 - 1, len(noise)])
        return b"  V1IDENTIFY\n" + struct.pack(">i", size) + noise
    lines = []
    for _ in range(rng.randrange(1, 12)):
        parts = [rng.choice(WORDS) for _ in range(rng.randrange(1, 4))]
        if rng.random() < 0.3:
            parts.append(rng.randbytes(rng.randrange(1, 20)))
        lines.append(b" ".join(parts) + rng.choice([b"\n", b"\r\n", b" \n"]))
    start = b"  V1" + (IDENTIFY if kind == 3 else b"")
    return start + b"".join(lines) + (noise if rng.random() < 0.3 else b"")


def http_payload(rng: random.Random) -> bytes:
    kind = rng.randrange(4)
    if kind == 0:
        return rng.randbytes(rng.randrange(1, 800))
    method = rng.choice([b"GET", b"POST", b"PUT", b"DELETE", b"OPTIONS", b"HEAD", b"G\x00T"])
    path = rng.choice(
        [
            b"/lookup",
            b"/channels",
            b"/topic/create",
            b"/channel/delete",
            b"/topic/tombstone",
            b"/debug",
            b"/nodes",
            b"/",
            b"//",
            b"/%zz",
            b"/topics/",
        ]
    )
    query = b"&".join(
        rng.choice([b"topic", b"channel", b"node", b"", b"%", b";"])
        + b"="
        + bytes(rng.choice(b"abc%;+=&#$/\xff 09AFzz") for _ in range(rng.randrange(0, 12)))
        for _ in range(rng.randrange(0, 4))
    )
    target = path + (b"?" + query if query else b"")
    if kind == 1:
        return method + b" " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    if kind == 2:
        headers = b"".join(
            rng.randbytes(rng.randrange(1, 30))
            + b": "
            + rng.randbytes(rng.randrange(0, 30))
            + b"\r\n"
            for _ in range(rng.randrange(1, 5))
        )
        return method + b" " + target + b" HTTP/1.1\r\nConnection: close\r\n" + headers + b"\r\n"
    body = rng.randbytes(rng.randrange(0, 200))
    length = len(body) if rng.random() < 0.8 else rng.randrange(0, 400)
    return (
        method + b" " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b"Content-Length: %d\r\n\r\n" % length + body
    )


def witness_connection(lookupd: DaemonProcess) -> socket.socket:
    sock = socket.create_connection(lookupd.tcp_address, timeout=5)
    sock.sendall(b"  V1" + IDENTIFY + b"REGISTER witness ch\n")
    replies = b""
    while len(split_replies_partial(replies)) < 2:
        chunk = sock.recv(4096)
        assert chunk
        replies += chunk
    assert split_replies_partial(replies)[1] == b"OK"
    return sock


def split_replies_partial(data: bytes) -> list[bytes]:
    out, pos = [], 0
    while len(data) - pos >= 4:
        (size,) = struct.unpack_from(">i", data, pos)
        if len(data) - pos - 4 < size:
            break
        out.append(data[pos + 4 : pos + 4 + size])
        pos += 4 + size
    return out


def lookup_witness(lookupd: DaemonProcess) -> dict[str, object]:
    conn = http.client.HTTPConnection(*lookupd.http_address, timeout=5)
    try:
        conn.request("GET", "/lookup?topic=witness")
        resp = conn.getresponse()
        assert resp.status == 200
        result: dict[str, object] = json.loads(resp.read())
        return result
    finally:
        conn.close()


def test_tcp_garbage(lookupd: DaemonProcess) -> None:
    witness = witness_connection(lookupd)
    for seed in SEEDS:
        rng = random.Random(seed)
        with socket.create_connection(lookupd.tcp_address, timeout=5) as sock:
            sock.sendall(tcp_payload(rng))
            sock.shutdown(socket.SHUT_WR)
            replies = split_replies(read_until_closed(sock))
        for reply in replies[:-1]:
            assert reply == b"OK" or reply.startswith(b"{"), (seed, replies)
        if replies and replies[-1] != b"OK" and not replies[-1].startswith(b"{"):
            assert replies[-1].startswith(b"E_"), (seed, replies)
    assert_still_healthy(lookupd, witness)


def read_http_response(sock: socket.socket) -> bytes:
    """What the server says before closing, or within a short wait if it expects more."""
    data = b""
    sock.settimeout(0.3)
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return data


def test_http_garbage(lookupd: DaemonProcess) -> None:
    witness = witness_connection(lookupd)
    statuses: list[bytes] = []
    for seed in SEEDS:
        rng = random.Random(10_000 + seed)
        payload = http_payload(rng)
        with socket.create_connection(lookupd.http_address, timeout=5) as sock:
            try:
                sock.sendall(payload)
            except (BrokenPipeError, ConnectionResetError):
                continue  # refused early: fine
            response = read_http_response(sock)
        status_line = response.split(b"\r\n", 1)[0]
        assert b" 500 " not in status_line, (seed, payload, response[:300])
        statuses.append(status_line[9:12])
    # the payloads reach the routes, not only the request parser
    assert {b"200", b"400", b"404"} <= set(statuses), statuses
    assert_still_healthy(lookupd, witness)


def assert_still_healthy(lookupd: DaemonProcess, witness: socket.socket) -> None:
    assert lookupd.proc is not None and lookupd.proc.poll() is None
    witness.sendall(b"PING\n")
    assert witness.recv(6) == b"\x00\x00\x00\x02OK"
    assert len(lookup_witness(lookupd)["producers"]) == 1  # type: ignore[arg-type]
    # and a newcomer is served normally
    with socket.create_connection(lookupd.tcp_address, timeout=5) as sock:
        sock.sendall(b"  V1" + IDENTIFY + b"REGISTER newcomer\n")
        data = b""
        while len(split_replies_partial(data)) < 2:
            chunk = sock.recv(4096)
            assert chunk
            data += chunk
        assert split_replies_partial(data)[1] == b"OK"
    log = lookupd.log
    assert "Traceback" not in log
    assert "Fatal error" not in log
    assert "panic" not in log
    witness.close()

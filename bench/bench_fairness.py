"""One misbehaving connection against an innocent client, nsqpy beside Go, row by row.

    python bench/bench_fairness.py --go-nsqd "$GO_NSQ_BIN/nsqd" \
        --go-nsqlookupd "$GO_NSQ_BIN/nsqlookupd" --duration 10

Each row starts a fresh daemon (Go's and ours alternating which goes first), an innocent
client and one attacker, each in its own process. The innocent client sends ``GET /ping``
over a new HTTP connection, and a PUB (nsqlookupd: a PING) over a TCP connection identified
before the attack, every ``--interval`` seconds while the attacker runs; it reports its
worst, p99 and median round trips. The attacker reports what it sent and whether the answers it
reads came back complete and in order. The daemon's RSS before the attack and its peak
(VmHWM), its CPU seconds during the attack window and the 1-minute load average complete
each row. Omit ``--go-nsqd``/``--go-nsqlookupd`` to run ours only; ``--only 4,6`` runs
selected rows (``6`` is both 6a and 6b). Every attack ends after ``--duration`` seconds
(one-shot rows: when answered, within ``--duration + --grace``); traffic stays on
127.0.0.1, and only the processes this script starts are stopped.

The attackers publish to topic ``flood``, which has no channel: past ``--mem-queue-size``
its messages go to the disk queue, so a one-shot row's own answer (6a, 6b, 7) can take
seconds on a slow disk while the innocent client is served; ``--nsqd-args`` passes the same
extra flags to both nsqds (e.g. ``--nsqd-args=--mem-queue-size=3000000``). ``--nsqpy-src``
runs our daemons from another checkout's ``src`` (a ``git worktree`` of an older commit) to
put a before beside an after.

Rows:
  1   pipelined ``NOP`` flood, no IDENTIFY, nothing read
  2   IDENTIFY deflate, then ~1 MiB of raw deflate inflating to ~1 GiB of ``NOP``
  3   a max-rate PUB stream on one connection, every reply read and checked
  4   after SUB (no RDY), 40 MiB of ``FIN <16-byte id not in flight>``, replies read
  5   the same FINs, never reading a byte back (RSS growth is the figure)
  6a  one MPUB of 1,048,575 one-byte messages, sent whole
  6b  the same MPUB sent in 4 KiB pieces (``--piece-gap`` apart)
  7   HTTP ``POST /mpub`` of ``--max-body-size`` bytes of ``x`` lines
  8   nsqlookupd: one TCP connection looping REGISTER/UNREGISTER; the innocent client asks
      lookupd's ``/ping`` and ``/lookup`` and PINGs on its own TCP connection
  9   nsqd HTTP: ``POST /pub`` pipelined on ``--http-connections`` keep-alive connections
  10  an auth server (started here) grants topic ``^(a+)+$``; one PUB to ``--auth-as`` a's
      followed by ``-``
  11  ``flood`` gets 100 channels and no consumer, the nsqd ``--mem-queue-size=1000000``
      (bench.sh's fan-out): pipelined MPUBs of 200 x 200 bytes, replies read, up to
      1,200,000 messages held in memory for every channel; ours only (Go copies a message
      for each channel: 120 million copies would take it about 15 GB)
"""

from __future__ import annotations

import argparse
import http.server
import json
import multiprocessing as mp
import os
import queue
import shlex
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from bench_nsqd import cpu_seconds, free_port, peak_rss_mb

MIB = 1 << 20
_SIZE = struct.Struct(">i")
_FRAME = struct.Struct(">ii")
OK_FRAME = _FRAME.pack(6, 0) + b"OK"
LOOKUPD_OK = _SIZE.pack(2) + b"OK"
#: Every attacker and probe socket blocks at most this long per call, so loops see deadlines.
SOCKET_TICK = 0.25
#: The topic the auth server grants: Python's backtracking ``re`` is exponential on it.
AUTH_PATTERN = "^(a+)+$"
AUTH_SECRET = "bench-secret"


# ---------------------------------------------------------------------------- wire helpers


def connect(port: int, magic: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if magic:
        sock.sendall(magic)
    sock.settimeout(SOCKET_TICK)
    return sock


def with_body(line: bytes, body: bytes) -> bytes:
    return line + _SIZE.pack(len(body)) + body


def identify(fields: dict[str, Any]) -> bytes:
    return with_body(b"IDENTIFY\n", json.dumps(fields).encode())


class Replies:
    """Size-prefixed replies read off one socket: nsqd's frames (size, type, data) or, with
    ``typed=False``, nsqlookupd's (size, data)."""

    def __init__(self, sock: socket.socket, typed: bool = True) -> None:
        self.sock = sock
        self.typed = typed
        self.buf = bytearray()
        self.pos = 0
        self.closed = False
        self.last_raw = b""

    def fill(self, deadline: float) -> bool:
        """Read once more; False when the deadline passed or the peer closed."""
        if time.monotonic() >= deadline or self.closed:
            return False
        try:
            chunk = self.sock.recv(1 << 20)
        except TimeoutError:
            return True
        except OSError:
            chunk = b""
        if not chunk:
            self.closed = True
            return False
        if self.pos:
            del self.buf[: self.pos]
            self.pos = 0
        self.buf += chunk
        return True

    def pop(self) -> tuple[int, bytes] | None:
        """The next whole reply already read, or None."""
        if len(self.buf) - self.pos < 4:
            return None
        (size,) = _SIZE.unpack_from(self.buf, self.pos)
        end = self.pos + 4 + size
        if size < 0 or end > len(self.buf):
            return None
        start = self.pos + (8 if self.typed else 4)
        kind = _SIZE.unpack_from(self.buf, self.pos + 4)[0] if self.typed else 0
        self.last_raw = bytes(self.buf[self.pos : end])
        self.pos = end
        return kind, bytes(self.buf[start:end])

    def next(self, deadline: float) -> tuple[int, bytes] | None:
        """The next reply that is not a heartbeat (answered with NOP); None at the deadline."""
        while True:
            reply = self.pop()
            if reply is not None:
                if reply == (0, b"_heartbeat_"):
                    self.sock.sendall(b"NOP\n")
                    continue
                return reply
            if not self.fill(deadline):
                return None

    def take_run(self, template: bytes) -> int:
        """Consume the leading copies of ``template`` already read; how many there were."""
        size = len(template)
        whole = (len(self.buf) - self.pos) // size
        if whole and self.buf[self.pos : self.pos + whole * size] == template * whole:
            self.pos += whole * size
            return whole
        count = 0
        while self.buf.startswith(template, self.pos):
            self.pos += size
            count += 1
        return count

    def leftover(self) -> bytes:
        rest = bytes(self.buf[self.pos :])
        self.pos = len(self.buf)
        return rest


def send_until(sock: socket.socket, data: bytes | memoryview, deadline: float) -> int:
    """Send as much of ``data`` as the peer takes before ``deadline``; the bytes sent."""
    view = memoryview(data)
    sent = 0
    while sent < len(view) and time.monotonic() < deadline:
        try:
            sent += sock.send(view[sent : sent + MIB])
        except TimeoutError:
            continue
        except OSError:
            break
    return sent


class Flood:
    """Copies of one command sent as fast as the socket takes them, commands kept whole."""

    def __init__(self, sock: socket.socket, unit: bytes, per_unit: int = 1) -> None:
        self.sock = sock
        self.unit_len = len(unit)
        self.per_unit = per_unit
        self.block = memoryview(unit * max(1, MIB // len(unit)))
        self.sent = 0
        self.began = 0.0
        self.accepted_at = 0.0
        self.done = threading.Event()

    @property
    def commands(self) -> int:
        return self.sent // self.unit_len * self.per_unit

    @property
    def last_accepted(self) -> float:
        """Seconds from the start until the socket last took bytes."""
        return max(0.0, self.accepted_at - self.began)

    def run(self, deadline: float, finish_by: float, limit: int | None = None) -> None:
        """Send until ``deadline`` (or ``limit`` bytes), then finish the command under way."""
        cap = None if limit is None else limit - limit % self.unit_len
        self.began = time.monotonic()
        try:
            while (cap is None or self.sent < cap) and time.monotonic() < deadline:
                self._send_some(cap)
            while self.sent % self.unit_len and time.monotonic() < finish_by:
                self._send_some(self.sent + self.unit_len - self.sent % self.unit_len)
        except OSError:
            pass
        finally:
            self.done.set()

    def _send_some(self, cap: int | None) -> None:
        offset = self.sent % len(self.block)
        piece = self.block[offset:]
        if cap is not None:
            piece = piece[: cap - self.sent]
        try:
            count = self.sock.send(piece)
        except TimeoutError:
            return
        self.sent += count
        self.accepted_at = time.monotonic()


def check_replies(
    replies: Replies,
    flood: Flood,
    expected: Callable[[int, bytes], bool],
    finish_by: float,
) -> tuple[int, str]:
    """Read replies until one per command sent has come back; (count, first problem)."""
    answers = 0
    template = b""
    while time.monotonic() < finish_by:
        if flood.done.is_set() and answers >= flood.commands:
            return answers, ""
        if template:
            answers += replies.take_run(template)
        reply = replies.pop()
        if reply is None:
            if not replies.fill(finish_by):
                break
            continue
        if not expected(*reply):
            return answers, f"reply {answers}: {reply[1][:60]!r}"
        answers += 1
        template = replies.last_raw
    return answers, "" if answers >= flood.commands else "replies missing"


# --------------------------------------------------------------------------- the attacks


@dataclass
class AttackArgs:
    tcp: int
    http: int
    duration: float
    grace: float
    ready: Any
    go: Any
    deflate_payload: bytes = b""
    mpub_count: int = 1_048_575
    piece_size: int = 4096
    piece_gap: float = 0.001
    max_body_size: int = 5 * MIB
    http_connections: int = 4
    auth_as: int = 26

    def start(self) -> tuple[float, float]:
        """Signal ready, wait for go; (attack deadline, last moment to collect answers)."""
        self.ready.set()
        self.go.wait()
        now = time.monotonic()
        return now + self.duration, now + self.duration + self.grace


def outcome(
    sent: int, commands: int, answers: int | None = None, problem: str = "", note: str = ""
) -> dict[str, Any]:
    return {
        "sent": sent,
        "commands": commands,
        "answers": answers,
        "problem": problem,
        "note": note,
    }


def identified_nsqd(args: AttackArgs, fields: dict[str, Any] | None = None) -> Replies:
    sock = connect(args.tcp, b"  V2")
    sock.sendall(identify({"client_id": "attacker", **(fields or {})}))
    replies = Replies(sock)
    if fields is None:
        expect_ok(replies, "IDENTIFY")
    return replies


def expect_ok(replies: Replies, what: str) -> None:
    reply = replies.next(time.monotonic() + 10)
    if reply != (0, b"OK"):
        raise RuntimeError(f"{what} answered {reply!r}")


def attack_nop_flood(args: AttackArgs) -> dict[str, Any]:
    sock = connect(args.tcp, b"  V2")
    deadline, finish_by = args.start()
    flood = Flood(sock, b"NOP\n")
    flood.run(deadline, finish_by)
    sock.close()
    return outcome(flood.sent, flood.commands, note="NOP has no reply")


def deflate_payload(inflated: int = 1 << 30) -> bytes:
    """Raw deflate of ``inflated`` bytes of ``NOP\\n``: one 1 MiB block compressed once and
    repeated (a full flush resets the window, so every copy decodes alike)."""
    compressor = zlib.compressobj(6, zlib.DEFLATED, -15)
    block = compressor.compress(b"NOP\n" * (MIB // 4)) + compressor.flush(zlib.Z_FULL_FLUSH)
    return block * max(1, inflated // MIB)


def attack_deflate(args: AttackArgs) -> dict[str, Any]:
    fields = {"feature_negotiation": True, "deflate": True, "deflate_level": 6}
    replies = identified_nsqd(args, fields)
    reply = replies.next(time.monotonic() + 10)
    if reply is None or not json.loads(reply[1]).get("deflate"):
        raise RuntimeError(f"deflate not negotiated: {reply!r}")
    inflater = zlib.decompressobj(-15)
    plain = inflater.decompress(replies.leftover())
    give_up = time.monotonic() + 10
    while len(plain) < len(OK_FRAME) and replies.fill(give_up):
        plain += inflater.decompress(replies.leftover())
    upgraded = plain[: len(OK_FRAME)] == OK_FRAME
    deadline, _ = args.start()
    sent = send_until(replies.sock, args.deflate_payload, deadline)
    replies.sock.close()
    inflates_to = sent * (1 << 30) // max(1, len(args.deflate_payload)) // 4
    return outcome(
        sent,
        inflates_to,
        int(upgraded),
        "" if upgraded else f"compressed OK not seen: {plain[:20]!r}",
        "commands: NOPs the bytes sent inflate to",
    )


def flood_with_replies(
    args: AttackArgs,
    replies: Replies,
    unit: bytes,
    expected: Callable[[int, bytes], bool],
    limit: int | None = None,
) -> dict[str, Any]:
    deadline, finish_by = args.start()
    flood = Flood(replies.sock, unit)
    result: list[tuple[int, str]] = []
    reader = threading.Thread(
        target=lambda: result.append(check_replies(replies, flood, expected, finish_by))
    )
    reader.start()
    flood.run(deadline, finish_by, limit)
    reader.join(finish_by - time.monotonic() + 5)
    replies.sock.close()
    answers, problem = result[0] if result else (0, "reader did not finish")
    return outcome(flood.sent, flood.commands, answers, problem)


def attack_pub_stream(args: AttackArgs) -> dict[str, Any]:
    replies = identified_nsqd(args)
    unit = with_body(b"PUB flood\n", b"x" * 100)
    return flood_with_replies(args, replies, unit, lambda kind, data: (kind, data) == (0, b"OK"))


def subscribed(args: AttackArgs) -> Replies:
    replies = identified_nsqd(args)
    replies.sock.sendall(b"SUB fin c\n")
    expect_ok(replies, "SUB")
    return replies


FIN_BAD_ID = b"FIN 0000000000000bad\n"


def attack_fin_read(args: AttackArgs) -> dict[str, Any]:
    replies = subscribed(args)
    return flood_with_replies(
        args,
        replies,
        FIN_BAD_ID,
        lambda kind, data: kind == 1 and data.startswith(b"E_FIN_FAILED"),
        limit=40 * MIB,
    )


def attack_fin_unread(args: AttackArgs) -> dict[str, Any]:
    replies = subscribed(args)
    deadline, finish_by = args.start()
    flood = Flood(replies.sock, FIN_BAD_ID)
    flood.run(deadline, finish_by, 40 * MIB)
    replies.sock.close()
    note = f"last byte taken at {flood.last_accepted:.2f} s (kernel buffers included)"
    return outcome(flood.sent, flood.commands, note=note)


#: row 11: channels of ``flood``, and the messages published to it
FANOUT_CHANNELS = 100
FANOUT_MESSAGES = 1_200_000
FANOUT_BATCH = 200


def attack_fanout_backlog(args: AttackArgs) -> dict[str, Any]:
    replies = identified_nsqd(args)
    body = _SIZE.pack(FANOUT_BATCH) + (_SIZE.pack(200) + b"x" * 200) * FANOUT_BATCH
    unit = with_body(b"MPUB flood\n", body)
    limit = len(unit) * (FANOUT_MESSAGES // FANOUT_BATCH)
    return flood_with_replies(
        args, replies, unit, lambda kind, data: (kind, data) == (0, b"OK"), limit=limit
    )


def mpub_command(count: int) -> bytes:
    body = _SIZE.pack(count) + (_SIZE.pack(1) + b"x") * count
    return with_body(b"MPUB flood\n", body)


def attack_mpub(args: AttackArgs, pieces: bool) -> dict[str, Any]:
    replies = identified_nsqd(args)
    command = mpub_command(args.mpub_count)
    _, finish_by = args.start()
    began = time.monotonic()
    if pieces:
        sent = 0
        for offset in range(0, len(command), args.piece_size):
            sent += send_until(replies.sock, command[offset : offset + args.piece_size], finish_by)
            time.sleep(args.piece_gap)
    else:
        sent = send_until(replies.sock, command, finish_by)
    reply = replies.next(finish_by)
    answered = time.monotonic() - began
    replies.sock.close()
    problem = "" if reply == (0, b"OK") else f"answer {reply!r}"[:80]
    return outcome(sent, 1, int(reply is not None), problem, f"answered after {answered:.3f} s")


def http_exchange(sock: socket.socket, request: bytes, deadline: float) -> tuple[int, bytes]:
    """Send one request with ``Connection: close``; (status, body) read until EOF."""
    send_until(sock, request, deadline)
    data = bytearray()
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(1 << 16)
        except TimeoutError:
            continue
        except OSError:
            break
        if not chunk:
            break
        data += chunk
    head, _, body = bytes(data).partition(b"\r\n\r\n")
    parts = head.split(b" ", 2)
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    return status, body


def attack_http_mpub(args: AttackArgs) -> dict[str, Any]:
    lines = args.max_body_size // 2
    body = b"x\n" * lines
    request = (
        b"POST /mpub?topic=flood HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    sock = connect(args.http)
    _, finish_by = args.start()
    began = time.monotonic()
    status, answer = http_exchange(sock, request, finish_by)
    answered = time.monotonic() - began
    sock.close()
    if status == 0:
        problem = f"no answer within {args.duration + args.grace:.0f} s"
    else:
        problem = "" if status == 200 else f"{status} {answer[:60]!r}"
    note = f"{lines:,} lines, {len(body):,} B; answered after {answered:.3f} s"
    return outcome(len(request), lines, int(status != 0), problem, note)


def attack_lookupd_register(args: AttackArgs) -> dict[str, Any]:
    sock = connect(args.tcp, b"  V1")
    peer = {"broadcast_address": "127.0.0.1", "hostname": "attacker", "version": "1.3.0"}
    sock.sendall(identify({**peer, "tcp_port": 1, "http_port": 2}))
    replies = Replies(sock, typed=False)
    if replies.next(time.monotonic() + 10) is None:
        raise RuntimeError("lookupd IDENTIFY unanswered")
    deadline, finish_by = args.start()
    flood = Flood(sock, b"REGISTER flood c\nUNREGISTER flood c\n", per_unit=2)
    result: list[tuple[int, str]] = []
    reader = threading.Thread(
        target=lambda: result.append(
            check_replies(replies, flood, lambda _k, data: data == b"OK", finish_by)
        )
    )
    reader.start()
    flood.run(deadline, finish_by)
    reader.join(finish_by - time.monotonic() + 5)
    sock.close()
    answers, problem = result[0] if result else (0, "reader did not finish")
    return outcome(flood.sent, flood.commands, answers, problem)


class HttpReplies:
    """HTTP/1.1 responses with Content-Length, read back to back off one connection."""

    def __init__(self, sock: socket.socket) -> None:
        self.replies = Replies(sock)

    def next(self, deadline: float) -> tuple[int, bytes] | None:
        buf = self.replies.buf
        while True:
            start = self.replies.pos
            head_end = buf.find(b"\r\n\r\n", start)
            if head_end >= 0:
                head = bytes(buf[start:head_end]).lower()
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip() == b"content-length":
                        length = int(value)
                if len(buf) >= head_end + 4 + length:
                    body = bytes(buf[head_end + 4 : head_end + 4 + length])
                    self.replies.pos = head_end + 4 + length
                    return int(head.split(b" ", 2)[1]), body
            if not self.replies.fill(deadline):
                return None
            buf = self.replies.buf


PUB_REQUEST = b"POST /pub?topic=flood HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\n\r\nhello"


def pub_over_http(
    port: int, deadline: float, finish_by: float, window: int, totals: list[tuple[int, int, str]]
) -> None:
    """Pipeline ``window`` POST /pub requests, read their answers, repeat until the deadline."""
    request = PUB_REQUEST
    sock = connect(port)
    responses = HttpReplies(sock)
    sent = answered = 0
    problem = ""
    try:
        while time.monotonic() < deadline and not problem:
            data = request * window
            whole = send_until(sock, data, finish_by) // len(request)
            sent += whole
            for _ in range(whole):
                answer = responses.next(finish_by)
                if answer != (200, b"OK"):
                    problem = f"answer {answered}: {answer!r}"[:80]
                    break
                answered += 1
    finally:
        sock.close()
        totals.append((sent, answered, problem))


def attack_http_pub(args: AttackArgs) -> dict[str, Any]:
    deadline, finish_by = args.start()
    totals: list[tuple[int, int, str]] = []
    threads = [
        threading.Thread(target=pub_over_http, args=(args.http, deadline, finish_by, 64, totals))
        for _ in range(args.http_connections)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(finish_by - time.monotonic() + 5)
    sent = sum(t[0] for t in totals)
    problems = "; ".join(t[2] for t in totals if t[2])
    note = f"{args.http_connections} keep-alive connections, 64 requests pipelined"
    return outcome(sent * len(PUB_REQUEST), sent, sum(t[1] for t in totals), problems, note)


def authorized(replies: Replies) -> None:
    replies.sock.sendall(with_body(b"AUTH\n", AUTH_SECRET.encode()))
    reply = replies.next(time.monotonic() + 10)
    if reply is None or reply[0] != 0:
        raise RuntimeError(f"AUTH answered {reply!r}")


def attack_auth_regex(args: AttackArgs) -> dict[str, Any]:
    replies = identified_nsqd(args)
    authorized(replies)
    topic = "a" * args.auth_as + "-"
    _, finish_by = args.start()
    began = time.monotonic()
    replies.sock.sendall(with_body(f"PUB {topic}\n".encode(), b"x"))
    reply = replies.next(finish_by)
    answered = time.monotonic() - began
    replies.sock.close()
    refused = reply is not None and reply[0] == 1 and reply[1].startswith(b"E_UNAUTHORIZED")
    problem = "" if refused else f"answer {reply!r}"[:80]
    said = reply[1][:40].decode(errors="replace") if reply else "nothing"
    note = f"answered after {answered:.3f} s: {said}"
    return outcome(1, 1, int(reply is not None), problem, note)


# ------------------------------------------------------------------------- innocent client


@dataclass
class ProbeArgs:
    target: str
    tcp: int
    http: int
    interval: float
    timeout: float
    auth: bool


def http_probe(port: int, path: str, timeout: float) -> tuple[float, str]:
    began = time.monotonic()
    deadline = began + timeout
    request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode()
    try:
        sock = connect(port)
        try:
            status, _ = http_exchange(sock, request, deadline)
        finally:
            sock.close()
    except OSError as error:
        return time.monotonic() - began, repr(error)
    spent = time.monotonic() - began
    return spent, "" if status == 200 else f"status {status}"


def tcp_prober(args: ProbeArgs) -> tuple[Replies, bytes, Callable[[int, bytes], bool]]:
    """An identified connection and the command timed on it, with its expected answer."""
    if args.target == "nsqlookupd":
        sock = connect(args.tcp, b"  V1")
        peer = {"broadcast_address": "127.0.0.1", "hostname": "innocent", "version": "1.3.0"}
        sock.sendall(identify({**peer, "tcp_port": 3, "http_port": 4}))
        replies = Replies(sock, typed=False)
        replies.next(time.monotonic() + 10)
        sock.sendall(b"REGISTER innocent c\n")
        replies.next(time.monotonic() + 10)
        return replies, b"PING\n", lambda _k, data: data == b"OK"
    sock = connect(args.tcp, b"  V2")
    sock.sendall(identify({"client_id": "innocent"}))
    replies = Replies(sock)
    expect_ok(replies, "IDENTIFY")
    topic = b"innocent"
    if args.auth:
        authorized(replies)
        topic = b"aaaa"
    return replies, with_body(b"PUB " + topic + b"\n", b"ping"), lambda k, d: (k, d) == (0, b"OK")


def paced(interval: float, go: Any, stop: Any, probe: Callable[[], tuple[float, str]]) -> Any:
    """Run ``probe`` every ``interval`` from go until stop; (seconds, problems)."""
    go.wait()
    times: list[float] = []
    problems: list[str] = []
    due = time.monotonic()
    while not stop.is_set():
        spent, problem = probe()
        times.append(spent)
        if problem:
            problems.append(problem)
            if problem.startswith("stop:"):
                break
        due = max(due + interval, time.monotonic())
        stop.wait(max(0.0, due - time.monotonic()))
    return {"times": times, "problems": problems}


def probe_main(args: ProbeArgs, ready: Any, go: Any, stop: Any, results: Any) -> None:
    replies, command, expected = tcp_prober(args)

    def tcp_probe() -> tuple[float, str]:
        began = time.monotonic()
        replies.sock.sendall(command)
        reply = replies.next(began + args.timeout)
        spent = time.monotonic() - began
        if reply is None:  # the connection is out of step from here on
            return spent, f"stop: no answer within {args.timeout:.0f} s"
        return spent, "" if expected(*reply) else f"answer {reply!r}"[:80]

    paths = ["/ping", "/lookup?topic=innocent"] if args.target == "nsqlookupd" else ["/ping"]
    tcp_name = "TCP PING" if args.target == "nsqlookupd" else "TCP PUB"
    probes: dict[str, Callable[[], tuple[float, str]]] = {tcp_name: tcp_probe}
    for path in paths:
        probes[f"HTTP {path.split('?')[0]}"] = partial(http_probe, args.http, path, args.timeout)
    found: dict[str, Any] = {}

    def run_probe(name: str, probe: Callable[[], tuple[float, str]]) -> None:
        found[name] = paced(args.interval, go, stop, probe)

    threads = [
        threading.Thread(target=run_probe, args=(name, probe)) for name, probe in probes.items()
    ]
    for thread in threads:
        thread.start()
    ready.set()
    for thread in threads:
        thread.join()
    results.put(found)


def attacker_main(row: str, args: AttackArgs, results: Any) -> None:
    try:
        found = ROWS[row].attack(args)
    except Exception as error:  # reported in the table, and the row goes on
        args.ready.set()
        found = outcome(0, 0, problem=f"attacker failed: {error!r}"[:120])
    results.put(found)


# ------------------------------------------------------------------------------- the rows


@dataclass(frozen=True)
class Row:
    title: str
    target: str
    attack: Callable[[AttackArgs], dict[str, Any]]
    auth: bool = False
    channels: int = 0  # channels of topic ``flood`` made before the attack
    nsqd_args: tuple[str, ...] = ()  # the row's own flags, after --nsqd-args
    go: bool = True  # whether Go's daemon runs it too


ROWS: dict[str, Row] = {
    "1": Row("pipelined NOP flood, no IDENTIFY", "nsqd", attack_nop_flood),
    "2": Row("1 MiB of deflate inflating to 1 GiB of NOP", "nsqd", attack_deflate),
    "3": Row("max-rate PUB stream, replies read", "nsqd", attack_pub_stream),
    "4": Row("40 MiB of FIN <bad id> after SUB, replies read", "nsqd", attack_fin_read),
    "5": Row("the same FINs, never reading a byte back", "nsqd", attack_fin_unread),
    "6a": Row("one MPUB of 1,048,575 one-byte messages", "nsqd", lambda a: attack_mpub(a, False)),
    "6b": Row("the same MPUB in 4 KiB pieces", "nsqd", lambda a: attack_mpub(a, True)),
    "7": Row("HTTP /mpub of one-byte lines up to max body size", "nsqd", attack_http_mpub),
    "8": Row("nsqlookupd REGISTER/UNREGISTER loop", "nsqlookupd", attack_lookupd_register),
    "9": Row("HTTP POST /pub flood on keep-alive connections", "nsqd", attack_http_pub),
    "10": Row("auth grants ^(a+)+$; PUB to a...a-", "nsqd", attack_auth_regex, auth=True),
    "11": Row(
        "MPUBs to 100 channels, 1.2M messages held in memory",
        "nsqd",
        attack_fanout_backlog,
        channels=FANOUT_CHANNELS,
        nsqd_args=("--mem-queue-size=1000000",),
        go=False,
    ),
}


def selected_rows(only: str) -> list[str]:
    if not only:
        return list(ROWS)
    wanted = {part.strip() for part in only.split(",") if part.strip()}
    return [key for key in ROWS if key in wanted or key.rstrip("ab") in wanted]


# ---------------------------------------------------------------------------- the daemons


@dataclass
class Daemon:
    """One nsqd or nsqlookupd process, Go's or ours, on free loopback ports."""

    command: list[str]
    target: str
    data: str
    env: dict[str, str] | None = None
    tcp: int = field(default_factory=free_port)
    http: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        flags = [f"--tcp-address=127.0.0.1:{self.tcp}", f"--http-address=127.0.0.1:{self.http}"]
        if self.target == "nsqd":
            flags += [f"--data-path={self.data}", "--broadcast-address=127.0.0.1"]
        self.proc = subprocess.Popen(
            [*self.command, *flags],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=self.env,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                self.request("GET", "/ping")
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"{self.command[0]} did not start")

    def request(self, method: str, path: str) -> bytes:
        url = f"http://127.0.0.1:{self.http}{path}"
        with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=5) as r:
            body: bytes = r.read()
            return body

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid


def vm_rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class RssSampler(threading.Thread):
    """The largest VmRSS seen while it runs (VmHWM also counts start-up)."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = 0.0
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(0.01):
            self.peak = max(self.peak, vm_rss_mb(self.pid))


class AuthServer:
    """A loopback auth server granting publish and subscribe on ``AUTH_PATTERN``."""

    def __init__(self) -> None:
        grant = {
            "ttl": 3600,
            "identity": "bench",
            "identity_url": "",
            "authorizations": [
                {"topic": AUTH_PATTERN, "channels": [".*"], "permissions": ["subscribe", "publish"]}
            ],
        }
        body = json.dumps(grant).encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_GET

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# ------------------------------------------------------------------------------ one run


@dataclass
class Measured:
    probes: dict[str, Any]
    attack: dict[str, Any]
    rss_before: float
    rss_peak: float
    rss_hwm: float
    cpu: float
    window: float
    load: float
    exited: int | None


def command_for(kind: str, target: str, args: argparse.Namespace) -> list[str]:
    if kind == "go":
        command = [args.go_nsqd if target == "nsqd" else args.go_nsqlookupd]
    else:
        command = [sys.executable, "-m", f"nsqpy.{target}"]
    return command + (shlex.split(args.nsqd_args) if target == "nsqd" else [])


def env_for(kind: str, args: argparse.Namespace) -> dict[str, str] | None:
    """``--nsqpy-src`` runs our daemons from another checkout's ``src`` (e.g. a git worktree
    of an older commit), ahead of the installed one."""
    if kind == "go" or not args.nsqpy_src:
        return None
    return {**os.environ, "PYTHONPATH": str(Path(args.nsqpy_src).resolve())}


def run_row(key: str, kind: str, args: argparse.Namespace, extras: dict[str, Any]) -> Measured:
    row = ROWS[key]
    command = command_for(kind, row.target, args) + list(row.nsqd_args)
    if row.auth:
        command.append(f"--auth-http-address=127.0.0.1:{extras['auth_port']}")
    with tempfile.TemporaryDirectory() as data:
        daemon = Daemon(command, row.target, data, env_for(kind, args))
        daemon.start()
        try:
            if row.target == "nsqd":
                for topic in ("innocent", "flood"):
                    daemon.request("POST", f"/topic/create?topic={topic}")
                for n in range(row.channels):
                    daemon.request("POST", f"/channel/create?topic=flood&channel=c{n}")
            return attack_and_probe(key, daemon, args, extras)
        finally:
            daemon.stop()


def attack_and_probe(
    key: str, daemon: Daemon, args: argparse.Namespace, extras: dict[str, Any]
) -> Measured:
    row = ROWS[key]
    ctx = mp.get_context("fork")
    probe_ready, attack_ready, go, stop = ctx.Event(), ctx.Event(), ctx.Event(), ctx.Event()
    probe_results: Any = ctx.Queue()
    attack_results: Any = ctx.Queue()
    probe_args = ProbeArgs(row.target, daemon.tcp, daemon.http, args.interval, args.grace, row.auth)
    attack_args = AttackArgs(
        daemon.tcp,
        daemon.http,
        args.duration,
        args.grace,
        attack_ready,
        go,
        deflate_payload=extras.get("deflate", b""),
        piece_gap=args.piece_gap,
        max_body_size=args.max_body_size,
        http_connections=args.http_connections,
        auth_as=args.auth_as,
    )
    prober = ctx.Process(target=probe_main, args=(probe_args, probe_ready, go, stop, probe_results))
    attacker = ctx.Process(target=attacker_main, args=(key, attack_args, attack_results))
    prober.start()
    attacker.start()
    try:
        if not (probe_ready.wait(30) and attack_ready.wait(30)):
            raise RuntimeError("the innocent client or the attacker did not get ready")
        cpu_before = cpu_seconds(daemon.pid)
        rss_before = vm_rss_mb(daemon.pid)
        sampler = RssSampler(daemon.pid)
        sampler.start()
        began = time.monotonic()
        go.set()
        try:
            found = attack_results.get(timeout=args.duration + args.grace + 30)
        except queue.Empty:
            found = outcome(0, 0, problem="attacker did not finish")
        time.sleep(max(0.0, began + args.duration - time.monotonic()))
        stop.set()
        window = time.monotonic() - began
        cpu = cpu_seconds(daemon.pid) - cpu_before
        rss_hwm = peak_rss_mb(daemon.pid)
        sampler.halt.set()
        probes = probe_results.get(timeout=args.grace + 30)
    finally:
        stop.set()
        go.set()
        for proc in (prober, attacker):
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
    exited = daemon.proc.poll() if daemon.proc is not None else None
    return Measured(
        probes,
        found,
        rss_before,
        sampler.peak,
        rss_hwm,
        cpu,
        window,
        os.getloadavg()[0],
        exited,
    )


# ---------------------------------------------------------------------------------- report


def worst_p99_and_median(times: list[float]) -> tuple[float, float, float]:
    if not times:
        return 0.0, 0.0, 0.0
    ordered = sorted(times)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return ordered[-1], p99, ordered[len(ordered) // 2]


def probe_cell(probe: dict[str, Any] | None) -> str:
    if not probe or not probe["times"]:
        return "no samples"
    worst, p99, median = worst_p99_and_median(probe["times"])
    cell = f"{worst * 1e3:.1f} / {p99 * 1e3:.1f} / {median * 1e3:.1f} ms (n={len(probe['times'])})"
    if probe["problems"]:
        cell += f"; {len(probe['problems'])} failed: {probe['problems'][0]}"
    return cell


def attack_cell(found: dict[str, Any]) -> str:
    parts = [f"{found['sent'] / MIB:.1f} MiB sent, {found['commands']:,} commands"]
    if found["answers"] is not None:
        parts.append(f"{found['answers']:,} answers")
    if found["problem"]:
        parts.append(f"PROBLEM: {found['problem']}")
    elif found["answers"] is not None:
        parts.append("all as expected, in order")
    if found["note"]:
        parts.append(found["note"])
    return "; ".join(parts)


def print_row(key: str, runs: dict[str, Measured]) -> None:
    kinds = list(runs)
    print(f"\n### {key}. {ROWS[key].title}")
    print("| | " + " | ".join(kinds) + " |")
    print("|---" * (len(kinds) + 1) + "|")
    names: list[str] = []
    for measured in runs.values():
        names += sorted(name for name in measured.probes if name not in names)
    for name in names:
        cells = [probe_cell(runs[kind].probes.get(name)) for kind in kinds]
        print(f"| innocent {name} worst / p99 / median | " + " | ".join(cells) + " |")
    lines: list[tuple[str, Callable[[Measured], str]]] = [
        ("attacker", lambda m: attack_cell(m.attack)),
        (
            "server RSS before -> peak sampled (VmHWM)",
            lambda m: f"{m.rss_before:.0f} -> {m.rss_peak:.0f} MB ({m.rss_hwm:.0f} MB)",
        ),
        ("server CPU in the window", lambda m: f"{m.cpu:.2f} s of {m.window:.1f} s"),
        ("load average (1 min) after", lambda m: f"{m.load:.2f}"),
        ("server exited", lambda m: "no" if m.exited is None else f"yes, code {m.exited}"),
    ]
    for label, show in lines:
        print(f"| {label} | " + " | ".join(show(runs[kind]) for kind in kinds) + " |")
    sys.stdout.flush()


def print_summary(results: dict[str, dict[str, Measured]]) -> None:
    print("\n### summary: the innocent client's worst round trip (ms), every probe")
    kinds = sorted({k for runs in results.values() for k in runs})
    print("| row | " + " | ".join(kinds) + " |")
    print("|---" * (len(kinds) + 1) + "|")
    for key, runs in results.items():
        cells = []
        for kind in kinds:
            measured = runs.get(kind)
            if measured is None:
                cells.append("-")
                continue
            worst = [
                f"{name} {max(probe['times'] or [0.0]) * 1e3:.1f}"
                for name, probe in sorted(measured.probes.items())
            ]
            cells.append(", ".join(worst))
        print(f"| {key}. {ROWS[key].title} | " + " | ".join(cells) + " |")


# -------------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    """The command line; ``build_parser().parse_args([])`` is every default, for callers."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--go-nsqd", default="", help="Go nsqd binary (omit: ours only)")
    parser.add_argument("--go-nsqlookupd", default="", help="Go nsqlookupd binary")
    parser.add_argument("--nsqd-args", default="", help="extra flags for both nsqds")
    parser.add_argument("--nsqpy-src", default="", help="run our daemons from this src dir")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per attack")
    parser.add_argument(
        "--grace", type=float, default=30.0, help="seconds to wait for answers after --duration"
    )
    parser.add_argument("--interval", type=float, default=0.05, help="innocent probe period")
    parser.add_argument("--only", default="", help="rows to run, e.g. 1,4,6")
    parser.add_argument("--piece-gap", type=float, default=0.001, help="row 6b: between pieces")
    parser.add_argument("--max-body-size", type=int, default=5 * MIB, help="row 7: body bytes")
    parser.add_argument("--http-connections", type=int, default=4, help="row 9")
    parser.add_argument("--auth-as", type=int, default=26, help="row 10: a's before the -")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    keys = selected_rows(args.only)
    extras: dict[str, Any] = {}
    if "2" in keys:
        extras["deflate"] = deflate_payload()
    auth = AuthServer() if "10" in keys else None
    if auth is not None:
        extras["auth_port"] = auth.port
    results: dict[str, dict[str, Measured]] = {}
    try:
        for index, key in enumerate(keys):
            go_binary = args.go_nsqd if ROWS[key].target == "nsqd" else args.go_nsqlookupd
            kinds = ["go", "nsqpy"] if go_binary and ROWS[key].go else ["nsqpy"]
            if index % 2:
                kinds.reverse()
            runs: dict[str, Measured] = {}
            for kind in kinds:
                print(f"row {key} {kind} ...", file=sys.stderr, flush=True)
                runs[kind] = run_row(key, kind, args, extras)
            results[key] = {kind: runs[kind] for kind in sorted(runs)}
            print_row(key, results[key])
    finally:
        if auth is not None:
            auth.close()
    print_summary(results)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Throughput of nsqpy.client against a fresh nsqpy nsqd (or one you name).

    python bench/bench_client.py --messages 200000 --size 200

Prints producer msgs/s for pipelined PUB (``--concurrency`` publishes outstanding at once) and
for MPUB (``--batch-size`` messages per command), then consumer msgs/s end to end: the topic is
filled, and a Consumer whose handler only returns (so the message is FINished) drains it with
``--max-in-flight``. ``--others`` drains the same number of messages with pynsq, ansq and (in an
interpreter of its own, ``--gnsq-python``) gnsq on the same nsqd. ``--read-path`` also compares
asyncio.Protocol with StreamReader for reading message frames (no nsqd), the measurement behind
the client's choice of Protocol.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import struct
import sys
import tempfile
import time
from collections.abc import Iterator

from nsqpy.client import Consumer, Message, Producer
from nsqpy.protocol.frames import FRAME_TYPE_MESSAGE, FrameDecoder, encode_frame
from nsqpy.protocol.message import encode_message
from nsqpy.testing import start_nsqd


def rate(count: int, seconds: float) -> str:
    return f"{count / seconds:12,.0f} msgs/s  ({count} in {seconds:.2f}s)"


async def bench_pub(address: str, topic: str, count: int, body: bytes, concurrency: int) -> float:
    async with Producer(address) as producer:
        await producer.publish(topic, body)  # connect outside the timing
        started = time.perf_counter()
        remaining = count

        async def worker(n: int) -> None:
            for _ in range(n):
                await producer.publish(topic, body)

        share, extra = divmod(remaining, concurrency)
        await asyncio.gather(*(worker(share + (i < extra)) for i in range(concurrency)))
        return time.perf_counter() - started


async def bench_mpub(address: str, topic: str, count: int, body: bytes, batch: int) -> float:
    async with Producer(address) as producer:
        await producer.publish(topic, body)
        bodies = [body] * batch
        started = time.perf_counter()
        sent = 0
        window: list[asyncio.Future[None]] = []
        while sent < count:
            n = min(batch, count - sent)
            window.append(asyncio.ensure_future(producer.multi_publish(topic, bodies[:n])))
            sent += n
            if len(window) >= 4:  # a few batches in flight keep the pipe full
                await window.pop(0)
        await asyncio.gather(*window)
        return time.perf_counter() - started


async def bench_consume(address: str, topic: str, count: int, max_in_flight: int) -> float:
    done = asyncio.Event()
    received = 0

    def handle(message: Message) -> None:
        nonlocal received
        received += 1
        if received >= count:
            done.set()

    consumer = Consumer(
        topic, "bench", handle, nsqd_tcp_addresses=[address], max_in_flight=max_in_flight
    )
    started = time.perf_counter()
    await consumer.start()
    await done.wait()
    elapsed = time.perf_counter() - started
    await consumer.close()
    return elapsed


# ---------------------------------------------------------------------- other Python clients


async def fill(address: str, topic: str, count: int, body: bytes, batch: int) -> None:
    async with Producer(address) as producer:
        for start in range(0, count, batch):
            await producer.multi_publish(topic, [body] * min(batch, count - start))


async def bench_pynsq(address: str, topic: str, count: int, max_in_flight: int) -> float:
    """pynsq's Reader (Tornado on this asyncio loop); its handler returns True: FIN."""
    import nsq

    done = asyncio.Event()
    received = 0

    def handle(message: object) -> bool:
        nonlocal received
        received += 1
        if received >= count:
            done.set()
        return True

    started = time.perf_counter()
    reader = nsq.Reader(
        topic=topic,
        channel="bench",
        message_handler=handle,
        nsqd_tcp_addresses=[address],
        max_in_flight=max_in_flight,
    )
    await done.wait()
    elapsed = time.perf_counter() - started
    reader.close()
    return elapsed


async def bench_ansq(address: str, topic: str, count: int) -> float:
    """ansq's Reader: ``async for`` over its messages, ``await message.fin()`` each (ansq
    keeps RDY 1 per connection)."""
    import ansq

    started = time.perf_counter()
    reader = await ansq.create_reader(topic=topic, channel="bench", nsqd_tcp_addresses=[address])
    received = 0
    async for message in reader.messages():
        await message.fin()
        received += 1
        if received >= count:
            break
    elapsed = time.perf_counter() - started
    await reader.close()
    return elapsed


#: gnsq runs on gevent, which patches the standard library: it gets an interpreter of its own.
_GNSQ_CONSUMER = """
import sys, time, gnsq
address, topic, count, max_in_flight = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
consumer = gnsq.Consumer(topic, "bench", nsqd_tcp_addresses=[address], max_in_flight=max_in_flight)
received = 0
@consumer.on_message.connect
def handle(consumer, message):
    global received
    received += 1
    if received >= count:
        consumer.close()
started = time.perf_counter()
consumer.start()
print(time.perf_counter() - started)
"""


async def bench_gnsq(python: str, address: str, topic: str, count: int, rdy: int) -> float:
    """gnsq's Consumer (auto-FIN after the handler) in ``python``, an interpreter with gnsq."""
    proc = await asyncio.create_subprocess_exec(
        python,
        "-c",
        _GNSQ_CONSUMER,
        address,
        topic,
        str(count),
        str(rdy),
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=600)
    return float(out.decode().split()[-1])


async def bench_others(address: str, args: argparse.Namespace, body: bytes) -> None:
    count = args.others_messages
    stamp = int(time.time())
    for name in ("nsqpy", "pynsq", "ansq", "gnsq"):
        topic = f"bench_{name}_{stamp}"
        await fill(address, topic, count, body, args.batch_size)
        if name == "nsqpy":
            elapsed = await bench_consume(address, topic, count, args.max_in_flight)
        elif name == "pynsq":
            elapsed = await bench_pynsq(address, topic, count, args.max_in_flight)
        elif name == "ansq":
            elapsed = await bench_ansq(address, topic, count)
        elif args.gnsq_python:
            elapsed = await bench_gnsq(args.gnsq_python, address, topic, count, args.max_in_flight)
        else:
            print("consumer gnsq: skipped (gevent-based: pass --gnsq-python)")
            continue
        print(f"consumer {name:6} (same nsqd)             {rate(count, elapsed)}")


# ---------------------------------------------------------------------- read path


def message_frames(count: int, size: int) -> bytes:
    body = b"x" * size
    frame = encode_frame(FRAME_TYPE_MESSAGE, encode_message(0, 1, b"0123456789abcdef", body))
    return frame * count


async def serve_frames(data: bytes) -> tuple[asyncio.Server, int]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(data)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def read_with_protocol(port: int, count: int) -> float:
    loop = asyncio.get_running_loop()
    finished = loop.create_future()

    class Reader(asyncio.Protocol):
        def __init__(self) -> None:
            self.decoder = FrameDecoder()
            self.seen = 0

        def data_received(self, data: bytes) -> None:
            for _frame in self.decoder.feed(data):
                self.seen += 1
            if self.seen >= count and not finished.done():
                finished.set_result(None)

    started = time.perf_counter()
    transport, _ = await loop.create_connection(Reader, "127.0.0.1", port)
    await finished
    transport.close()
    return time.perf_counter() - started


async def read_with_streams(port: int, count: int) -> float:
    header = struct.Struct(">ii")
    started = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for _ in range(count):
        size, _frame_type = header.unpack(await reader.readexactly(8))
        await reader.readexactly(size - 4)
    writer.close()
    return time.perf_counter() - started


async def bench_read_path(count: int, size: int) -> None:
    server, port = await serve_frames(message_frames(count, size))
    async with server:
        for name, func in (
            ("asyncio.Protocol", read_with_protocol),
            ("StreamReader", read_with_streams),
        ):
            best = min([await func(port, count) for _ in range(3)])
            print(f"read path {name:17} {rate(count, best)}")


# ---------------------------------------------------------------------- main


@contextlib.contextmanager
def nsqd_address(address: str | None) -> Iterator[str]:
    if address:
        yield address
        return
    with tempfile.TemporaryDirectory() as data:
        nsqd = start_nsqd(data, "--mem-queue-size=10000000")
        try:
            yield "{}:{}".format(*nsqd.tcp_address)
        finally:
            nsqd.stop()


async def run(args: argparse.Namespace, address: str) -> None:
    body = b"a" * args.size
    stamp = int(time.time())
    pub_topic, mpub_topic = f"bench_pub_{stamp}", f"bench_mpub_{stamp}"
    pub_count = max(1, args.messages // 4)
    elapsed = await bench_pub(address, pub_topic, pub_count, body, args.concurrency)
    print(f"producer PUB  (concurrency {args.concurrency:4}) {rate(pub_count, elapsed)}")
    elapsed = await bench_mpub(address, mpub_topic, args.messages, body, args.batch_size)
    print(f"producer MPUB (batch {args.batch_size:4})       {rate(args.messages, elapsed)}")
    # the MPUB topic now holds --messages (+1) messages: drain them
    elapsed = await bench_consume(address, mpub_topic, args.messages, args.max_in_flight)
    print(f"consumer FIN  (max_in_flight {args.max_in_flight:4}) {rate(args.messages, elapsed)}")
    if args.others:
        await bench_others(address, args, body)
    if args.read_path:
        await bench_read_path(args.messages, args.size)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--max-in-flight", type=int, default=2500)
    parser.add_argument("--nsqd-tcp-address", default=None, help="use this nsqd, start none")
    # asyncio's own loop by default: what plain asyncio.run() gives a user of nsqpy.client
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="asyncio")
    parser.add_argument("--read-path", action="store_true", help="compare Protocol and streams")
    parser.add_argument(
        "--others", action="store_true", help="drain with pynsq and ansq too, on the same nsqd"
    )
    parser.add_argument("--others-messages", type=int, default=50_000)
    parser.add_argument("--gnsq-python", help="a Python with gnsq installed (gnsq needs gevent)")
    args = parser.parse_args(argv)
    if args.loop == "uvloop":
        try:
            import uvloop

            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        except ImportError:
            print("uvloop not installed; using asyncio's loop")
    print(f"client loop: {args.loop}; {args.messages} messages of {args.size} bytes")
    with nsqd_address(args.nsqd_tcp_address) as address:
        asyncio.run(run(args, address))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""``make run``: a local nsqd in the foreground, and how to publish to it and consume from it.

python -m nsqpy.demo                 # start nsqd on 127.0.0.1:4150 (TCP) and :4151 (HTTP)
python -m nsqpy.demo consume TOPIC   # print messages of TOPIC as they arrive (Ctrl-C stops)
"""

from __future__ import annotations

import asyncio
import os
import sys

from .nsqd.__main__ import main as nsqd_main
from .protocol import FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE, FrameDecoder, commands, decode_message

TCP = "127.0.0.1:4150"
HTTP = "127.0.0.1:4151"

INSTRUCTIONS = f"""
nsqpy demo: nsqd is starting in the foreground (Ctrl-C stops it cleanly).

  TCP  {TCP}     HTTP  http://{HTTP}     data  ./data

Publish:
  curl -d 'hello world' 'http://{HTTP}/pub?topic=test'
Consume (in another terminal):
  .venv/bin/python -m nsqpy.demo consume test
Inspect:
  curl 'http://{HTTP}/stats'
"""


async def consume(topic: str, channel: str = "demo#ephemeral") -> None:
    host, port = TCP.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"  V2" + commands.sub(topic, channel) + commands.rdy(100))
    decoder = FrameDecoder()
    print(f"consuming {topic}/{channel} from {TCP}", flush=True)
    while data := await reader.read(65536):
        for frame in decoder.feed(data):
            if frame.frame_type == FRAME_TYPE_MESSAGE:
                msg = decode_message(frame.data)
                print(msg.body.decode(errors="replace"), flush=True)
                writer.write(commands.fin(msg.id))
            elif frame.frame_type == FRAME_TYPE_ERROR:
                print(f"error: {frame.data.decode()}", file=sys.stderr)
            elif frame.data == b"_heartbeat_":
                writer.write(commands.nop())


def main(argv: list[str]) -> int:
    if argv[:1] == ["consume"]:
        topic = argv[1] if len(argv) > 1 else "test"
        try:
            asyncio.run(consume(topic))
        except KeyboardInterrupt:
            pass
        return 0
    os.makedirs("data", exist_ok=True)
    print(INSTRUCTIONS, flush=True)
    return nsqd_main([f"--tcp-address={TCP}", f"--http-address={HTTP}", "--data-path=data"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

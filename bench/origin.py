"""The bench origin: counting HTTP servers and a raw TCP byte source, on 127.0.0.1 only.

Run as its own process (``python -m bench.origin``) pinned to the load generator's core. It
prints one JSON line with its ports, then serves until stdin closes:

- ``http_ports`` (two of them): every request gets the same 100-byte body with keep-alive
  (``Connection: close`` in the request closes after the response). Requests are counted per
  port, so every figure can be checked against what the origin really received.
- ``source_port``: the client sends ``N\\n``; the source streams N bytes and closes.
- ``control_port``: a line ``counts`` returns the per-port request counts as a JSON line.

Requests carry no body (GET only), so a request is counted per end of head (CRLF CRLF).
"""

from __future__ import annotations

import asyncio
import functools
import json
import socket
import sys
from collections import Counter
from typing import cast

BODY = b"x" * 99 + b"\n"
RESPONSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % len(BODY)
) + BODY
CLOSE_RESPONSE = RESPONSE.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n", 1)
HOST = "127.0.0.1"
CHUNK = memoryview(b"\0" * (1 << 20))  # the source writes 1 MiB at a time
MAX_HEAD_BUFFER = 1 << 16  # a partial head longer than this is a broken client: drop it

counts: Counter[int] = Counter()


class CountingHTTP(asyncio.Protocol):
    """Answers every request head with RESPONSE and counts it against the listening port."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        buf = self.buf + data
        heads = buf.split(b"\r\n\r\n")
        self.buf = heads.pop()
        if len(self.buf) > MAX_HEAD_BUFFER:
            self.transport.close()
            return
        if not heads:
            return
        counts[self.port] += len(heads)
        closing = b"connection: close" in heads[-1].lower()
        if closing:
            self.transport.write(RESPONSE * (len(heads) - 1) + CLOSE_RESPONSE)
            self.transport.close()
        else:
            self.transport.write(RESPONSE * len(heads))


class ByteSource(asyncio.Protocol):
    """Streams the requested number of bytes, honouring the transport's flow control."""

    def __init__(self) -> None:
        self.buf = b""
        self.left = -1
        self.paused = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.transport.set_write_buffer_limits(high=4 << 20)

    def data_received(self, data: bytes) -> None:
        if self.left >= 0:
            return
        self.buf += data
        if b"\n" in self.buf:
            self.left = int(self.buf.split(b"\n", 1)[0])
            self._pump()

    def _pump(self) -> None:
        assert self.transport is not None
        while self.left > 0 and not self.paused:
            n = min(self.left, len(CHUNK))
            self.transport.write(CHUNK[:n])
            self.left -= n
        if self.left == 0:
            self.transport.close()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self._pump()


class Control(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        if b"\n" in data:
            self.transport.write(json.dumps({str(k): v for k, v in counts.items()}).encode())
            self.transport.write(b"\n")


async def serve() -> None:
    loop = asyncio.get_running_loop()
    servers = []
    http_ports = []
    for _ in range(2):
        sock = socket.socket()
        sock.bind((HOST, 0))
        port = sock.getsockname()[1]
        server = await loop.create_server(
            functools.partial(CountingHTTP, port), sock=sock, backlog=4096
        )
        http_ports.append(port)
        servers.append(server)
    source = await loop.create_server(ByteSource, HOST, 0, backlog=4096)
    control = await loop.create_server(Control, HOST, 0)
    ports = {
        "http_ports": http_ports,
        "source_port": source.sockets[0].getsockname()[1],
        "control_port": control.sockets[0].getsockname()[1],
    }
    print(json.dumps(ports), flush=True)
    # Serve until the harness closes our stdin (or dies).
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    await reader.read()


def main() -> None:
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve())
    else:
        uvloop.run(serve())


if __name__ == "__main__":
    main()

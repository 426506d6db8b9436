"""Servers that live inside test hosts, or on loopback, served from the test's own event loop.

For a test host the listening socket is created inside the host's namespace
(`listen_in_netns`); with `host=None` it listens on 127.0.0.1 at an ephemeral port of this
namespace, so the test needs no root (`proxykit.exempt` lets the proxy's guard through to
exactly that port). Everything else is ordinary asyncio.

`Origin` is an aiohttp web app that records what reached it, so a test can assert on the
origin side (what was forwarded, which headers) and not only on what the proxy said.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

from egress.proxy.net.netns import listen_in_netns

from harness import TestHost


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


LOOPBACK = "127.0.0.1"


def listen(host: TestHost | None, bind: str, port: int) -> socket.socket:
    """A listening socket inside `host`, or on loopback (`host=None`: `port` 0 is ephemeral)."""
    if host is not None:
        return listen_in_netns(host.ns, bind, port)
    sock = socket.create_server((LOOPBACK, port), backlog=512)
    sock.setblocking(False)
    return sock


@dataclass
class Origin:
    host: TestHost | None
    port: int
    runner: web.AppRunner
    seen: list[Seen] = field(default_factory=list)

    @property
    def addr(self) -> str:
        return LOOPBACK if self.host is None else self.host.addr_ns

    @property
    def authority(self) -> str:
        """`ADDR:PORT`, as a URL or a CONNECT names it."""
        return f"{self.addr}:{self.port}"

    async def close(self) -> None:
        await self.runner.cleanup()


async def start_origin(host: TestHost | None, port: int = 80, *, bind: str = "0.0.0.0") -> Origin:
    """An HTTP origin on `bind:port` inside `host` (`host=None`: on 127.0.0.1:`port`).

    Routes: any path echoes a JSON summary of the request; `/bytes/N` returns N bytes;
    `/chunked/N` returns N bytes in chunked encoding.
    """
    app = web.Application(client_max_size=1 << 30)
    origin: Origin

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        origin.seen.append(Seen(request.method, request.path_qs, dict(request.headers), body))
        parts = request.path.split("/")
        if len(parts) == 3 and parts[1] == "bytes":
            return web.Response(body=b"x" * int(parts[2]))
        if len(parts) == 3 and parts[1] == "chunked":
            resp = web.StreamResponse()
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            left = int(parts[2])
            while left:
                n = min(left, 1000)
                await resp.write(b"y" * n)
                left -= n
            await resp.write_eof()
            return resp
        summary = {
            "method": request.method,
            "path": request.path_qs,
            "host": request.headers.get("Host"),
            "headers": {k.lower(): v for k, v in request.headers.items()},
            "body_sha256": hashlib.sha256(body).hexdigest(),
            "body_len": len(body),
            "server": origin.authority,
        }
        return web.json_response(summary)

    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sock = listen(host, bind, port)
    await web.SockSite(runner, sock).start()
    origin = Origin(host, sock.getsockname()[1], runner)
    return origin


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def start_tcp(
    host: TestHost | None, port: int, handler: Handler, bind: str = "0.0.0.0"
) -> asyncio.Server:
    """A raw TCP server inside `host` (`host=None`: on 127.0.0.1:`port`; `port_of` reads it)."""
    return await asyncio.start_server(handler, sock=listen(host, bind, port))


def port_of(server: asyncio.Server) -> int:
    return int(server.sockets[0].getsockname()[1])


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Echo until EOF, then half-close back."""
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def request_paths(reader: asyncio.StreamReader) -> AsyncIterator[str]:
    """The path of each request head a kept-alive client sends, until it closes or resets: the
    loop of a hand-written origin that answers by path (a body it reads itself)."""
    while True:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        yield head.split(b" ", 2)[1].decode()


def describe(resp_body: bytes) -> dict[str, object]:
    return json.loads(resp_body)  # type: ignore[no-any-return]


async def run(*argv: str, timeout: float = 30, cwd: str | None = None) -> tuple[int, str, str]:
    """Run a command without blocking the event loop (servers in this loop keep serving)."""
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=cwd
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")

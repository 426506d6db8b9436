"""Servers that live inside test hosts, served from the test's own event loop.

The listening socket is created inside the host's namespace (`listen_in_netns`); everything
else is ordinary asyncio. `Origin` is an aiohttp web app that records what reached it, so a
test can assert on the origin side (what was forwarded, which headers) and not only on what
the proxy said.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Awaitable, Callable
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


@dataclass
class Origin:
    host: TestHost
    port: int
    runner: web.AppRunner
    seen: list[Seen] = field(default_factory=list)

    @property
    def addr(self) -> str:
        return self.host.addr_ns

    async def close(self) -> None:
        await self.runner.cleanup()


async def start_origin(host: TestHost, port: int = 80, *, bind: str = "0.0.0.0") -> Origin:
    """An HTTP origin on `bind:port` inside `host`.

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
            "server": f"{host.addr_ns}:{port}",
        }
        return web.json_response(summary)

    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sock = listen_in_netns(host.ns, bind, port)
    await web.SockSite(runner, sock).start()
    origin = Origin(host, port, runner)
    return origin


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def start_tcp(
    host: TestHost, port: int, handler: Handler, bind: str = "0.0.0.0"
) -> asyncio.Server:
    """A raw TCP server inside `host`."""
    sock = listen_in_netns(host.ns, bind, port)
    return await asyncio.start_server(handler, sock=sock)


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

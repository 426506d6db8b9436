"""The proxy never blocks the event loop it shares with the framework (issue 3).

What blocks a loop is a blocking call made on the loop's thread: a synchronous DNS lookup, a
sleep, a file opened, a process started. Python announces each of them as an audit event
(`sys.addaudithook`), so this test records every such event raised on the loop's thread
while the proxy works, except in the test's own coroutine (its clients), and asserts there
are none. It measures no durations: a loaded machine cannot fail it, and a blocking call
fails it however fast the call happened to be. The workload crosses every path:
absolute-form with bodies, CONNECT, refusals, the audit log (its writer thread is another
thread), a name resolved through the system resolver (a pin), and shutdown.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from egress import AuditLog, EgressProxy, build_settings

from proxykit import exempt, raw_exchange, read_response
from servers import echo, port_of, start_origin, start_tcp

# Audit events of calls that block the calling thread.
BLOCKING = (
    "socket.getaddrinfo",
    "socket.gethostbyname",
    "socket.gethostbyaddr",
    "socket.getnameinfo",
    "time.sleep",  # (Python 3.12 and later)
    "open",
    "subprocess.Popen",
    "os.system",
    "os.fork",
    "os.exec",
    "os.posix_spawn",
)


class _Watch:
    """Blocking calls on one loop's thread outside one task (the test's own)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, exempt: asyncio.Task[Any] | None):
        self.loop, self.exempt = loop, exempt
        self.thread = threading.get_ident()
        self.seen: list[str] = []
        self.active = False

    def __call__(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.active or event not in BLOCKING or threading.get_ident() != self.thread:
            return
        task = asyncio.current_task(self.loop)
        if task is not None and task is self.exempt:
            return
        where = task.get_coro().__qualname__ if task is not None else "a loop callback"  # type: ignore[union-attr]
        self.seen.append(f"{event}{args[:2]!r} in {where}")


_watches: list[_Watch] = []


def _hook(event: str, args: tuple[Any, ...]) -> None:
    for watch in _watches:
        watch(event, args)


sys.addaudithook(_hook)  # (a hook cannot be removed: it does nothing unless a watch is active)


@contextmanager
def blocking_calls() -> Iterator[list[str]]:
    """The blocking calls made on the running loop's thread meanwhile, but by the caller."""
    watch = _Watch(asyncio.get_running_loop(), asyncio.current_task())
    _watches.append(watch)
    watch.active = True
    try:
        yield watch.seen
    finally:
        watch.active = False
        _watches.remove(watch)


async def test_the_watch_sees_a_blocking_call_in_another_task_and_not_in_ours() -> None:
    """The instrument itself: a file opened by another task on the loop is caught, one
    opened by the test's own coroutine is not."""

    async def blocker() -> None:
        open(os.devnull).close()

    with blocking_calls() as seen:
        open(os.devnull).close()
        await asyncio.create_task(blocker())
    assert len(seen) == 1
    assert seen[0].startswith("open")
    assert "blocker" in seen[0]


async def test_no_blocking_calls_on_the_loop(tmp_path: Path) -> None:
    # upstreams on loopback ports that the guard lets through
    origin = await start_origin(None, 0)
    echo_srv = await start_tcp(None, 0, echo)
    web, echo_port = origin.port, port_of(echo_srv)
    settings = build_settings(
        {"allow": [f"up.test:{web}", f"up.test:{echo_port}"], "block": ["evil.test"]},
        resolve=[f"up.test={origin.addr}", f"evil.test={origin.addr}"],
    )
    settings = exempt(settings, web, echo_port)
    try:
        with blocking_calls() as seen:
            async with (
                AuditLog(str(tmp_path / "a.jsonl")) as audit,
                EgressProxy(settings, audit=audit) as proxy,
            ):
                addr = proxy.addresses[0]
                reader, writer = await asyncio.open_connection(*addr)
                for i in range(50):
                    body = b"x" * (i * 100)
                    writer.write(
                        b"POST http://up.test:%d/p%d HTTP/1.1\r\nContent-Length: %d\r\n\r\n"
                        % (web, i, len(body))
                        + body
                    )
                    assert (await read_response(reader))[0] == 200
                writer.close()
                for _ in range(20):
                    r, w = await asyncio.open_connection(*addr)
                    w.write(b"CONNECT up.test:%d HTTP/1.1\r\n\r\nping" % echo_port)
                    await r.readuntil(b"\r\n\r\n")
                    assert await r.readexactly(4) == b"ping"
                    w.close()
                    assert (
                        await raw_exchange(
                            *addr, b"GET http://evil.test/ HTTP/1.1\r\nConnection: close\r\n\r\n"
                        )
                    ).startswith(b"HTTP/1.1 403")
    finally:
        echo_srv.close()
        await origin.close()
    assert seen == []

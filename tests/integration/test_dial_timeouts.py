"""A dial that gets no answer, on both drivers (the callback driver's `net/dialer.py` and the
coroutine driver's pool): the connect timeout moves on to the next address, and past the last
one refuses (504 connection_timeout, docs/proxy.md#limits); a proxy stopping meanwhile gives
the dial up and ends the connection.

The silent address is real: a loopback listening socket whose accept queue is full (nothing
accepts), so the kernel drops every further SYN and a connect waits. No root needed
(`proxykit.exempt`); nothing here sleeps to synchronize.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import socket
from collections.abc import Iterator

import pytest

from egress.config import build_settings
from egress.proxy.server import EgressProxy, Limits

from proxykit import MemoryAudit, exempt, raw_exchange
from servers import echo


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port of 127.0.0.1 that answers no SYN: its listener's accept queue (backlog 0: one
    connection) is held full by a connection nobody accepts."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = int(server.getsockname()[1])
    held = socket.create_connection(("127.0.0.1", port), timeout=5)
    probe = socket.socket()
    probe.settimeout(0.5)
    with pytest.raises(TimeoutError):  # the queue is full: a SYN now gets no answer
        probe.connect(("127.0.0.1", port))
    try:
        yield port
    finally:
        for s in (probe, held, server):
            s.close()


async def start_proxy(
    port: int, fast: bool, limits: Limits, also: str | None = None
) -> tuple[EgressProxy, MemoryAudit]:
    """A started proxy allowing `slow.test:port`, pinned to 127.0.0.1 and then `also`, on
    the callback driver (`fast`) or the coroutine driver."""
    pins = ["slow.test=127.0.0.1", *([f"slow.test={also}"] if also else [])]
    settings = exempt(build_settings(allow=[f"slow.test:{port}"], resolve=pins), port)
    if also is not None:  # the guard lets the second address through on this port too
        guard = settings.guard
        more = guard.exempt | {(ipaddress.ip_address(also), port)}
        settings = dataclasses.replace(settings, guard=dataclasses.replace(guard, exempt=more))
    audit = MemoryAudit()
    p = EgressProxy(settings, audit=audit, limits=limits)
    await p.start()
    p.steps.fast_path = fast
    return p, audit


DRIVERS = pytest.mark.parametrize("fast", [True, False], ids=["callback-driver", "coroutine"])


@DRIVERS
async def test_a_dial_with_no_answer_times_out(silent_port: int, fast: bool) -> None:
    p, audit = await start_proxy(silent_port, fast, Limits(connect_timeout=0.5))
    try:
        head = f"CONNECT slow.test:{silent_port} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
        reply = await raw_exchange(*p.addresses[0], head, timeout=20)
        rec = await audit.wait_for(host="slow.test")
    finally:
        await p.stop()
    assert reply.startswith(b"HTTP/1.1 504 "), reply[:200]
    assert (rec["decision"], rec["reason"]) == ("error", "connection_timeout"), rec


@DRIVERS
async def test_the_next_address_is_dialed_once_one_timed_out(silent_port: int, fast: bool) -> None:
    """The name's first address answers no SYN; the second (127.0.0.2) is an echo server."""
    server = await asyncio.start_server(echo, "127.0.0.2", silent_port)
    p, audit = await start_proxy(silent_port, fast, Limits(connect_timeout=0.5), "127.0.0.2")
    try:
        reader, writer = await asyncio.open_connection(*p.addresses[0])
        try:
            writer.write(
                f"CONNECT slow.test:{silent_port} HTTP/1.1\r\nHost: x\r\n\r\nping".encode()
            )
            async with asyncio.timeout(20):
                head = await reader.readuntil(b"\r\n\r\n")
                echoed = await reader.readexactly(4)
        finally:
            writer.close()
        rec = await audit.wait_for(host="slow.test")
    finally:
        await p.stop()
        server.close()
    assert head.startswith(b"HTTP/1.1 200 "), head
    assert echoed == b"ping"
    assert (rec["decision"], rec["addr"]) == ("allow", "127.0.0.2"), rec


@DRIVERS
async def test_a_proxy_stopping_gives_up_a_dial(silent_port: int, fast: bool) -> None:
    """A dial still waiting when the proxy stops is given up at the end of the grace
    (`Dialer.cancel`), on either driver: the stop returns, the client's connection ends, and
    the tunnel is recorded as failed (the coroutine driver once wrote no record here)."""
    limits = Limits(connect_timeout=60.0, shutdown_grace=0.5)
    p, audit = await start_proxy(silent_port, fast, limits)
    reader, writer = await asyncio.open_connection(*p.addresses[0])
    try:
        writer.write(f"CONNECT slow.test:{silent_port} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        async with asyncio.timeout(20):
            while not any(c.phase == "active" for c in p._conns):
                await asyncio.sleep(0.01)  # (polls a condition: the request is being served)
            await p.stop()
            rest = await reader.read()
        rec = await audit.wait_for(host="slow.test")
    finally:
        writer.close()
        await p.stop()
    assert not rest.startswith(b"HTTP/1.1 200 "), rest
    assert rec["decision"] == "error", rec
    assert rec["reason"] == "upstream_error", rec

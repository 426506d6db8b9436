"""The callback fast path (egress/proxy/fast.py) against the coroutine path, on real sockets.

Every kept-alive request is still parsed, identified, judged and audited: the same request
sequences go through one proxy with the fast path on and one with it off, and the client
must get the same bytes and the audit log the same records (all but timing and the
client's port), field for field and in order. The upstreams listen on loopback ports that
the guard lets through (`proxykit.exempt`): no root needed.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from egress.config import build_settings
from egress.proxy import server as server_mod
from egress.proxy.server import EgressProxy

from proxykit import MemoryAudit, exempt
from servers import Origin, port_of, start_origin, start_tcp


async def raw_origin(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A keep-alive origin whose answers are chosen by the request path (odd ones included)."""
    try:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            path = head.split(b" ", 2)[1].decode()
            if path == "/interim":
                writer.write(
                    b"HTTP/1.1 103 Early Hints\r\nLink: </s>\r\n\r\n"
                    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
                )
            elif path == "/upgrade":
                writer.write(
                    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\n"
                )
            elif path == "/vanish":
                writer.close()
                return
            elif path == "/garbage":
                writer.write(b"HTTP/1.1 2000 What\r\n\r\n")
            elif path == "/until-close":
                writer.write(b"HTTP/1.1 200 OK\r\n\r\n" + b"z" * 5000)
                writer.close()
                return
            elif path == "/cut":  # a Content-Length body cut short
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly-part")
                await writer.drain()
                writer.close()
                return
            elif path == "/hop":
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nKeep-Alive: 5\r\n\r\nok")
            else:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
    finally:
        writer.close()


@dataclass
class Both:
    origin: Origin
    raw_port: int
    fast: EgressProxy
    slow: EgressProxy
    audit_fast: MemoryAudit
    audit_slow: MemoryAudit


@pytest.fixture
async def both() -> AsyncIterator[Both]:
    origin = await start_origin(None, 0)
    raw = await start_tcp(None, 0, raw_origin)
    addr, web, raw_port = origin.addr, origin.port, port_of(raw)
    settings = build_settings(
        {
            "allow": [f"{addr}:{web}", f"{addr}:{raw_port}", f"www.test:{web}"],
            "block": ["evil.test"],
            "framework_routes": [],
        },
        resolve=[f"www.test={addr}", f"evil.test={addr}"],
    )
    settings = exempt(settings, web, raw_port)
    audit_fast, audit_slow = MemoryAudit(), MemoryAudit()
    fast = EgressProxy(settings, audit=audit_fast)
    slow = EgressProxy(settings, audit=audit_slow)
    await fast.start()
    await slow.start()
    slow.steps.fast_path = False
    try:
        yield Both(origin, raw_port, fast, slow, audit_fast, audit_slow)
    finally:
        await fast.stop()
        await slow.stop()
        raw.close()
        await origin.close()


async def read_one(reader: asyncio.StreamReader, method: str = "GET") -> bytes:
    """One response (1xx heads included) as received; the body by its framing."""
    out = b""
    while True:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            return out + exc.partial
        out += head
        status = int(head.split(b" ", 2)[1])
        if 100 <= status < 200:
            continue
        low = head.lower()
        if method == "HEAD" or status in (204, 304):
            return out
        m = re.search(rb"\r\ncontent-length: *(\d+)", low)
        if m:
            try:
                return out + await reader.readexactly(int(m.group(1)))
            except asyncio.IncompleteReadError as exc:
                return out + exc.partial
        if b"transfer-encoding: chunked" in low:
            return out + await reader.readuntil(b"\r\n0\r\n\r\n")
        return out + await reader.read(-1)


async def session(proxy: EgressProxy, requests: list[tuple[str, str]]) -> list[bytes]:
    """Send each (method, URL-or-raw-head) on one connection; the responses, Date removed."""
    reader, writer = await asyncio.open_connection(*proxy.addresses[0])
    got = []
    try:
        for method, req in requests:
            data = req if "\r\n" in req else f"{method} {req} HTTP/1.1\r\nHost: x\r\n\r\n"
            writer.write(data.encode())
            async with asyncio.timeout(10):
                got.append(re.sub(rb"\r\nDate: [^\r]*", b"", await read_one(reader, method)))
            if reader.at_eof():
                break
    finally:
        writer.close()
    return got


def comparable(events: list[dict[str, object]]) -> list[dict[str, object]]:
    """The records without what differs between two runs (timing, the client's port)."""
    skip = ("duration_ms", "client", "listener")
    return [{k: v for k, v in e.items() if k not in skip} for e in events]


def count_coroutine_requests(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the requests the coroutine path serves (`server.serve_request`)."""
    calls = [0]
    real: Callable[..., Any] = server_mod.serve_request

    async def counting(*args: Any) -> bool:
        calls[0] += 1
        result: bool = await real(*args)
        return result

    monkeypatch.setattr(server_mod, "serve_request", counting)
    return calls


async def run_both(b: Both, requests: list[tuple[str, str]]) -> tuple[list[bytes], list[bytes]]:
    fast = await session(b.fast, requests)
    slow = await session(b.slow, requests)
    return fast, slow


async def settle(audit: MemoryAudit, n: int) -> None:
    async with asyncio.timeout(5):
        while len(audit.events) < n:
            audit.changed.clear()
            await audit.changed.wait()


async def test_same_answers_and_records_on_a_kept_alive_connection(
    both: Both, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = both.origin.authority
    calls = count_coroutine_requests(monkeypatch)
    requests = [
        ("GET", f"http://{a}/first"),  # dials: the coroutine path
        ("GET", f"http://{a}/second?q=1"),  # fast: pooled upstream, all buffered
        ("GET", f"http://{a}/bytes/300000"),  # fast, a body larger than one read: relayed
        ("GET", f"http://{a}/chunked/5000"),  # fast, chunked
        ("HEAD", f"http://{a}/bytes/10"),
        (
            "GET",
            f"http://www.test:{both.origin.port}/pinned-name",
        ),  # a name from the resolver: fast
        ("GET", "http://evil.test/blocked"),  # refused: coroutine path, connection kept
        ("GET", f"http://{a}/after-refusal"),
        ("POST", f"POST http://{a}/body HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"),
        ("GET", f"GET http://{a}/hop HTTP/1.1\r\nHost: x\r\nProxy-Connection: x\r\n\r\n"),
        ("GET", f"GET http://{a}/last HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
    ]
    fast_calls_before = calls[0]
    fast = await session(both.fast, requests)
    fast_calls = calls[0] - fast_calls_before
    slow = await session(both.slow, requests)
    slow_calls = calls[0] - fast_calls - fast_calls_before
    assert fast == slow
    assert len(fast) == len(requests)
    assert fast[1].startswith(b"HTTP/1.1 200 ")
    assert b"/second?q=1" in fast[1]
    assert fast[2].endswith(b"x" * 1000)
    assert len(fast[2]) > 300000
    assert fast[6].startswith(b"HTTP/1.1 403 ")
    await settle(both.audit_fast, len(requests))
    await settle(both.audit_slow, len(requests))
    assert comparable(both.audit_fast.events) == comparable(both.audit_slow.events)
    assert len(both.audit_fast.events) == len(requests)
    # every request audited; the fast path took the plain kept-alive GETs and HEAD
    assert slow_calls == len(requests)
    assert fast_calls == 3, fast_calls  # first, evil.test (refused), POST (a body)


@pytest.mark.parametrize(
    "path", ["/interim", "/upgrade", "/vanish", "/garbage", "/until-close", "/cut", "/hop"]
)
async def test_same_answers_and_records_for_odd_upstreams(
    both: Both, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = f"{both.origin.addr}:{both.raw_port}"
    calls = count_coroutine_requests(monkeypatch)
    requests = [
        ("GET", f"http://{a}/warm"),
        ("GET", f"http://{a}{path}"),
        ("GET", f"http://{a}/after"),
    ]
    fast = await session(both.fast, requests)
    fast_calls = calls[0]
    slow = await session(both.slow, requests)
    assert fast == slow, (fast, slow)
    n = len([r for r in fast if r])  # one record per answered request
    assert fast_calls <= n - 1, "the request after the warm-up took the fast path"
    await settle(both.audit_fast, n)
    await settle(both.audit_slow, n)
    assert comparable(both.audit_fast.events) == comparable(both.audit_slow.events)


async def test_malformed_and_smuggling_heads_after_a_kept_alive_request(both: Both) -> None:
    a = both.origin.authority
    for bad in (
        f"GET http://{a}/ HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n"
        "Transfer-Encoding: chunked\r\n\r\n",
        f"GET http://{a}/ HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n",
        f"GET http://{a}/ HTTP/1.1\r\nHost: x\r\n Folded: yes\r\n\r\n",
        f"GET http://{a}/ HTTP/1.1\r\nHost: x\r\nContent_Length: 0\r\n\r\n",
        f"GET http://{a}/ HTTP/1.1\r\nHost: x\r\nX: a\rb\r\n\r\n",
    ):
        requests = [("GET", f"http://{a}/warm"), ("GET", bad)]
        fast, slow = await run_both(both, requests)
        assert fast == slow
        assert fast[1].startswith(b"HTTP/1.1 400 "), fast[1][:100]
    assert comparable(both.audit_fast.events) == comparable(both.audit_slow.events)


async def test_pipelined_requests_while_one_is_in_flight(both: Both) -> None:
    """Bytes of a next request that arrive during a fast exchange wait for its end."""
    a = both.origin.authority
    reader, writer = await asyncio.open_connection(*both.fast.addresses[0])
    try:
        writer.write(f"GET http://{a}/one HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert (await read_one(reader)).startswith(b"HTTP/1.1 200 ")
        writer.write(f"GET http://{a}/bytes/200000 HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        await writer.drain()
        writer.write(f"GET http://{a}/three HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        big = await read_one(reader)
        third = await read_one(reader)
    finally:
        writer.close()
    assert big.startswith(b"HTTP/1.1 200 ")
    assert big.endswith(b"x" * 1000)
    assert third.startswith(b"HTTP/1.1 200 ")
    assert b'"/three"' in third
    await settle(both.audit_fast, 3)
    assert [e["path"] for e in both.audit_fast.events] == ["/one", "/bytes/200000", "/three"]

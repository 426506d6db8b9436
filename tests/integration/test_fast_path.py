"""The callback fast path (proxy/drive/callback.py) against the coroutine path, on real sockets.

Every kept-alive request is still parsed, identified, judged and audited: the same request
sequences go through one proxy with the fast path on and one with it off, and the client
must get the same bytes and the audit log the same records (all but timing and the
client's port), field for field and in order. The upstreams listen on loopback ports that
the guard lets through (`proxykit.exempt`): no root needed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from ipaddress import ip_network
from typing import Any

import pytest

from egress.config import ClientSpec, build_settings
from egress.policy.rules import Policy
from egress.proxy import intake as intake_mod
from egress.proxy.server import EgressProxy, Limits

from proxykit import MemoryAudit, client_hello, exempt
from servers import Origin, echo, port_of, request_paths, start_origin, start_tcp


async def raw_origin(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A keep-alive origin whose answers are chosen by the request path (odd ones included)."""
    try:
        async for path in request_paths(reader):
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
    tls_port: int  # an echo server whose tunnels' SNI is checked (an https:// rule)
    dead_port: int  # an allowed port nothing listens on
    fast: EgressProxy
    slow: EgressProxy
    audit_fast: MemoryAudit
    audit_slow: MemoryAudit


@pytest.fixture
async def both() -> AsyncIterator[Both]:
    origin = await start_origin(None, 0)
    raw = await start_tcp(None, 0, raw_origin)
    tls = await start_tcp(None, 0, echo)
    addr, web, raw_port, tls_port = origin.addr, origin.port, port_of(raw), port_of(tls)
    with socket.socket() as s:  # a port free a moment ago: nothing listens on it
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    settings = build_settings(
        {
            "allow": [
                f"{addr}:{web}",
                f"{addr}:{raw_port}",
                f"www.test:{web}",
                f"https://www.test:{tls_port}",
                f"www.test:{dead}",
            ],
            "block": ["evil.test"],
            "framework_routes": [],
        },
        resolve=[f"www.test={addr}", f"evil.test={addr}"],
    )
    settings = exempt(settings, web, raw_port, tls_port, dead)
    audit_fast, audit_slow = MemoryAudit(), MemoryAudit()
    fast = EgressProxy(settings, audit=audit_fast)
    slow = EgressProxy(settings, audit=audit_slow)
    await fast.start()
    await slow.start()
    slow.steps.fast_path = False
    try:
        yield Both(origin, raw_port, tls_port, dead, fast, slow, audit_fast, audit_slow)
    finally:
        await fast.stop()
        await slow.stop()
        raw.close()
        tls.close()
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
    """Count the requests the coroutine path serves (`intake.serve_request`)."""
    calls = [0]
    real: Callable[..., Any] = intake_mod.serve_request

    async def counting(*args: Any) -> bool:
        calls[0] += 1
        result: bool = await real(*args)
        return result

    monkeypatch.setattr(intake_mod, "serve_request", counting)
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


# --- CONNECT tunnels: the callback driver (drive.callback.Carrier) against the coroutine driver


async def tunnel(proxy: EgressProxy, target: str, payload: bytes) -> bytes:
    """CONNECT `target` with `payload` right behind the head, half-close, and everything
    the proxy sent back until it closed (Date removed)."""
    reader, writer = await asyncio.open_connection(*proxy.addresses[0])
    try:
        writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode() + payload)
        writer.write_eof()
        async with asyncio.timeout(10):
            got = await reader.read(-1)
    finally:
        writer.close()
    return re.sub(rb"\r\nDate: [^\r]*", b"", got)


def count_calls(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[int]:
    """Count the calls of coroutine function `module.name`."""
    calls = [0]
    real: Callable[..., Any] = getattr(module, name)

    async def counting(*args: Any) -> None:
        calls[0] += 1
        await real(*args)

    monkeypatch.setattr(module, name, counting)
    return calls


async def test_same_answers_and_records_for_tunnels(
    both: Both, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every CONNECT outcome, from the callback driver and from the coroutine driver: the
    same bytes to the client, the same records; only the coroutine path runs `serve_tunnel`."""
    a = both.origin.addr
    get = b"GET /t HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    hello = client_hello("www.test")
    tls = f"www.test:{both.tls_port}"
    cases = [
        (f"{a}:{both.raw_port}", get),  # an address: dial, 200, relay
        (tls, hello),  # a pinned name, its SNI checked and relayed
        (tls, client_hello("evil.test")),  # SNI of a blocked name: cut
        (tls, b""),  # no ClientHello at all
        ("evil.test:443", b""),  # blocked: 403
        (f"{a}:{both.tls_port}", b""),  # a port its rule does not cover: 403
        ("no-port", b""),  # a bad target: 400
    ]
    served = count_calls(monkeypatch, intake_mod, "serve_tunnel")
    fast = [await tunnel(both.fast, target, payload) for target, payload in cases]
    assert served[0] == 0, "a CONNECT took the coroutine path with the callback driver on"
    slow = [await tunnel(both.slow, target, payload) for target, payload in cases]
    assert served[0] == len(cases)
    assert fast == slow
    assert fast[0].startswith(b"HTTP/1.1 200 ")
    assert b"HTTP/1.1 200 OK" in fast[0].split(b"\r\n\r\n", 1)[1]  # the origin's answer
    assert fast[1].endswith(hello)  # echoed back through the tunnel
    assert fast[4].startswith(b"HTTP/1.1 403 ")
    assert fast[5].startswith(b"HTTP/1.1 403 ")
    assert fast[6].startswith(b"HTTP/1.1 400 ")
    await settle(both.audit_fast, len(cases))
    await settle(both.audit_slow, len(cases))
    assert comparable(both.audit_fast.events) == comparable(both.audit_slow.events)
    assert "sni_mismatch" in [e["reason"] for e in both.audit_fast.events]


async def test_a_refused_dial(both: Both) -> None:
    """Nothing listens on the checked address: the same 502 and record from both drivers."""
    dead = f"www.test:{both.dead_port}"
    fast = await tunnel(both.fast, dead, b"")
    slow = await tunnel(both.slow, dead, b"")
    assert fast == slow
    assert fast.startswith(b"HTTP/1.1 502 ")
    await settle(both.audit_fast, 1)
    await settle(both.audit_slow, 1)
    assert comparable(both.audit_fast.events) == comparable(both.audit_slow.events)
    assert both.audit_fast.events[0]["reason"] == "connection_refused"


async def test_an_open_tunnel_has_no_task(both: Both) -> None:
    """The callback driver serves the whole tunnel: accept, head, dial, 200, SNI and relay
    without a task of its own (the coroutine driver's connection has one)."""
    hello = client_hello("www.test")
    for proxy, has_task in ((both.fast, False), (both.slow, True)):
        reader, writer = await asyncio.open_connection(*proxy.addresses[0])
        try:
            head = f"CONNECT www.test:{both.tls_port} HTTP/1.1\r\nHost: x\r\n\r\n"
            writer.write(head.encode() + hello)
            async with asyncio.timeout(10):
                head = await reader.readuntil(b"\r\n\r\n")
                echoed = await reader.readexactly(len(hello))
            assert head.startswith(b"HTTP/1.1 200 ")
            assert echoed == hello
            relaying = [c for c in proxy._conns if c.relaying is not None]
            assert len(relaying) == 1
            assert (relaying[0].task is not None) is has_task
            assert relaying[0].upstream is not None
        finally:
            writer.close()
    await settle(both.audit_fast, 1)
    await settle(both.audit_slow, 1)
    assert comparable(both.audit_fast.events) == comparable(both.audit_slow.events)


async def test_a_name_to_look_up_is_handed_to_the_coroutine_driver(
    both: Both, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name not in the resolver's cache: the callback driver hands the exchange it began
    to the coroutine driver (`tunnel.carry_on`), which looks it up and carries on."""
    from egress.proxy.drive import callback as fast_mod

    carried = count_calls(monkeypatch, fast_mod, "carry_on")
    monkeypatch.setattr(both.fast.resolver, "cached", lambda host: None)
    hello = client_hello("www.test")
    tls = f"www.test:{both.tls_port}"
    fast = await tunnel(both.fast, tls, hello)
    assert carried[0] == 1
    slow = await tunnel(both.slow, tls, hello)
    assert fast == slow
    assert fast.startswith(b"HTTP/1.1 200 ")
    assert fast.endswith(hello)
    await settle(both.audit_fast, 1)
    await settle(both.audit_slow, 1)
    assert comparable(both.audit_fast.events) == comparable(both.audit_slow.events)


async def test_a_connect_head_in_pieces_and_a_request_first(both: Both) -> None:
    """A CONNECT head that arrives in several reads is still the callback driver's; a
    first request that is not a CONNECT starts the coroutine path as before."""
    a = f"{both.origin.addr}:{both.raw_port}"
    for proxy in (both.fast, both.slow):
        reader, writer = await asyncio.open_connection(*proxy.addresses[0])
        try:
            for part in (b"CONNECT ", f"{a} HTTP/1.1\r\n".encode(), b"Host: x\r\n\r\n"):
                writer.write(part)
                await writer.drain()
            async with asyncio.timeout(10):
                head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 ")
        finally:
            writer.close()
        got = await session(proxy, [("GET", f"http://{a}/plain")])
        assert got[0].startswith(b"HTTP/1.1 200 ")
    await settle(both.audit_fast, 2)
    await settle(both.audit_slow, 2)
    assert comparable(both.audit_fast.events) == comparable(both.audit_slow.events)


# --- a kept-alive request at its client's fair share waits for its turn from callbacks ------


async def test_a_request_at_the_fair_share_waits_for_its_turn_without_the_coroutine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two requests of one client in flight (its share, `max_client_inflight=2`, while
    another client holds a connection): a third, kept-alive, waits for a turn in the
    callbacks (no coroutine request), reaches the origin only once one of the two ended,
    and is served and recorded as usual."""
    seen: list[tuple[str, bool]] = []  # (path, released when it arrived)
    release = asyncio.Event()
    two_held = asyncio.Event()

    async def holding(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async for path in request_paths(reader):
                seen.append((path, release.is_set()))
                if path == "/hold":
                    if sum(p == "/hold" for p, _ in seen) >= 4:
                        two_held.set()  # (the warm-up's two, then the phase's two)
                    await release.wait()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
        finally:
            writer.close()

    origin = await start_tcp(None, 0, holding)
    port = port_of(origin)
    settings = exempt(build_settings({"allow": [f"127.0.0.1:{port}"]}), port)
    # another client: a sandbox known by its source (loopback sources are otherwise one)
    other_sandbox = ClientSpec("other", Policy(), sources=(ip_network("127.0.0.2/32"),))
    settings = dataclasses.replace(settings, clients=(other_sandbox,))
    audit = MemoryAudit()
    proxy = EgressProxy(settings, audit=audit, limits=Limits(max_client_inflight=2))
    await proxy.start()
    conns = [await asyncio.open_connection(*proxy.addresses[0]) for _ in range(3)]
    # another client is present: the share applies
    other = await asyncio.open_connection(*proxy.addresses[0], local_addr=("127.0.0.2", 0))
    url = f"http://127.0.0.1:{port}"

    async def get(i: int, path: str) -> bytes:
        reader, writer = conns[i]
        writer.write(f"GET {url}{path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        return await read_one(reader)

    try:
        async with asyncio.timeout(20):
            # warm-up: two upstream connections dialed at once, each back in the pool
            warm = [asyncio.ensure_future(get(i, "/hold")) for i in (0, 1)]
            while sum(p == "/hold" for p, _ in seen) < 2:
                await asyncio.sleep(0.01)  # (polls a condition: both reached the origin)
            release.set()
            assert all(r.startswith(b"HTTP/1.1 200 ") for r in await asyncio.gather(*warm))
            assert (await get(2, "/warm")).startswith(b"HTTP/1.1 200 ")
            release.clear()
            calls = count_coroutine_requests(monkeypatch)
            held = [asyncio.ensure_future(get(i, "/hold")) for i in (0, 1)]
            await two_held.wait()
            third = asyncio.ensure_future(get(2, "/third"))
            sides = [c.side for c in proxy._conns]
            while not any(getattr(s, "parked", None) is not None for s in sides):
                await asyncio.sleep(0.01)  # (polls a condition: the third is parked)
            assert ("/third", False) not in seen
            release.set()
            answers = await asyncio.gather(*held, third)
    finally:
        for _, writer in (*conns, other):
            writer.close()
        await proxy.stop()
        origin.close()
    assert all(a.startswith(b"HTTP/1.1 200 ") for a in answers)
    assert ("/third", True) in seen  # it reached the origin only after the release
    assert calls[0] == 0, "a request of the phase took the coroutine path"
    paths = [e["path"] for e in audit.events]
    assert paths.count("/hold") == 4
    assert "/third" in paths

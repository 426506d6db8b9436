"""A connection belongs to a sandbox from `accept` (issue 19, item 1; docs/proxy.md#limits).

Real proxy, real sockets; the hoarding sandbox and its victim are real namespaces cut by
`prepare_execution`. Each test is a repro of the red-team pass: one sandbox holding every
slot with connections that never finish a handshake, unauthenticated connections locking a
token holder out of a `require_auth` listener, `reclaim_idle` closing another sandbox's
kept-alive connection, and connections closed or refused without a record.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

import netcut
from egress import EgressProxy, Policy, build_settings, prepare_execution, release_execution
from egress.boundary import Execution
from egress.config import ClientSpec, Settings
from egress.proxy.net.netns import call_in_netns_thread
from egress.proxy.server import Limits

import harness
from proxykit import MemoryAudit, read_response
from servers import Origin, run, start_origin

AGENT = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all",
         "--bounding-set=-all", "--"]  # fmt: skip
DENIED = b"GET http://denied.test/ HTTP/1.1\r\nHost: denied.test\r\n\r\n"


def refusals(audit: MemoryAudit, **want: object) -> int:
    """How many refusals the matching records stand for (an aggregated one carries `count`)."""
    return sum(int(str(e.get("count", 1))) for e in audit.find(**want))


async def wait_refusals(audit: MemoryAudit, n: int, **want: object) -> None:
    async with asyncio.timeout(15):
        while refusals(audit, **want) < n:
            audit.changed.clear()
            await audit.changed.wait()


@dataclass
class Scene:
    hoarder: harness.TestHost
    victim: harness.TestHost
    upstream: harness.TestHost
    origin: Origin
    proxy: EgressProxy
    audit: MemoryAudit
    bad: Execution
    good: Execution


@pytest.fixture
async def scene(test_host_factory: object) -> AsyncIterator[Scene]:
    hoarder = test_host_factory()  # type: ignore[operator]
    victim = test_host_factory()  # type: ignore[operator]
    upstream = test_host_factory()  # type: ignore[operator]
    origin = await start_origin(upstream, 80)
    audit = MemoryAudit()
    # connections that never finish their handshake stay for the whole test
    limits = Limits(max_connections=40, head_timeout=60.0)
    proxy = EgressProxy(build_settings({}), audit=audit, limits=limits)
    await proxy.start()
    policy = Policy(allow=[upstream.addr_ns, f"{upstream.addr_ns}:80"])  # :80 for SOCKS5 too
    try:
        # transparent too: each sandbox has every kind of listener a hoarder could fill
        bad = await prepare_execution(hoarder.ns, policy, proxy, socks_port=1080,
                                      transparent=True)  # fmt: skip
        good = await prepare_execution(victim.ns, policy, proxy, socks_port=1080,
                                       transparent=True)  # fmt: skip
        yield Scene(hoarder, victim, upstream, origin, proxy, audit, bad, good)
        await release_execution(proxy, bad, restore=True)
        await release_execution(proxy, good, restore=True)
    finally:
        await proxy.stop()
        await origin.close()
        for host in (hoarder, victim):
            with contextlib.suppress(netcut.NetcutError):
                await netcut.restore_async(host.ns)


def hoard(ns: str, port: int, n: int, first: bytes, host: str = "127.0.0.1") -> list[socket.socket]:
    """`n` connections from inside `ns` to `host:port` (its loopback by default), each
    sending `first`."""

    def open_all() -> list[socket.socket]:
        out = []
        for _ in range(n):
            s = socket.create_connection((host, port), timeout=5)
            if first:
                s.sendall(first)
            out.append(s)
        return out

    return call_in_netns_thread(ns, open_all)


async def curl(host: harness.TestHost, *args: str) -> str:
    _, out, _ = await run("ip", "netns", "exec", host.ns, *AGENT, "curl", "-s", "--max-time",
                          "10", "-o", "/dev/null", "-w", "%{http_code}", *args)  # fmt: skip
    return out.strip()


async def test_unauthenticated_connections_do_not_lock_out_a_token_holder() -> None:
    """`--require-auth`, `--max-connections 40`: 41 connections that never send a byte used
    to leave the token holder a 503. Now they share a small unidentified budget, the oldest
    is closed (and recorded) to make room, and the token holder is served."""
    audit = MemoryAudit()
    spec = ClientSpec("holder", Policy(), token="s3cret")
    settings = Settings(Policy(), clients=(spec,))
    limits = Limits(max_connections=40, head_timeout=60.0, identify_timeout=60.0)
    async with EgressProxy(settings, audit=audit, limits=limits, require_auth=True) as proxy:
        host, port = proxy.addresses[0]
        idle = [await asyncio.open_connection(host, port) for _ in range(41)]
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(
            b"GET http://denied.test/ HTTP/1.1\r\nHost: denied.test\r\n"
            b"Proxy-Authorization: Basic aG9sZGVyOnMzY3JldA==\r\n\r\n"
        )
        status, _, _ = await asyncio.wait_for(read_response(reader), 5)
        writer.close()
        assert status == 403  # judged by its own policy: admitted, identified
        record = await audit.wait_for(method="GET", host="denied.test")
        assert record["client_id"] == "holder"
        await wait_refusals(audit, 41 - limits.unidentified_total, reason="evicted")
        evicted = audit.find(reason="evicted")
        assert all(e["end"] == "evicted" and e["mode"] == "http" for e in evicted)
        assert "client_id" not in evicted[0]  # unidentified: no client to name
        for _, w in idle:
            w.close()


async def test_identify_deadline_closes_and_records() -> None:
    """A connection on a token listener that names no client within `identify_timeout` is
    closed, with a record (before: held until the head timeout, with none)."""
    audit = MemoryAudit()
    spec = ClientSpec("holder", Policy(), token="s3cret")
    limits = Limits(identify_timeout=0.2, head_timeout=30.0)
    settings = Settings(Policy(), clients=(spec,))
    async with EgressProxy(settings, audit=audit, limits=limits, require_auth=True) as proxy:
        reader, writer = await asyncio.open_connection(*proxy.addresses[0])
        assert await asyncio.wait_for(reader.read(-1), 10) == b""
        writer.close()
        record = await audit.wait_for(reason="identify_timeout")
        assert record["end"] == "identify_timeout"
        host, port = proxy.addresses[0]
        assert record["listener"] == f"{host}:{port}"


async def test_the_global_cap_never_reclaims_another_clients_connection() -> None:
    """At the global cap, `reclaim_idle` closed the longest-idle kept-alive connection
    whoever held it (67,001 of the other sandboxes' connections in one run). Now a newcomer
    may only take the place of its own client's idle connection."""
    audit = MemoryAudit()
    a = ClientSpec("a", Policy(), token="token-a")
    b = ClientSpec("b", Policy(), token="token-b")
    limits = Limits(max_connections=2, max_client_connections=2)
    settings = Settings(Policy(), clients=(a, b))

    def request(token: str) -> bytes:
        import base64

        cred = base64.b64encode(f"x:{token}".encode()).decode()
        auth = f"\r\nProxy-Authorization: Basic {cred}\r\n\r\n"
        return DENIED.replace(b"\r\n\r\n", auth.encode())

    async with EgressProxy(settings, audit=audit, limits=limits) as proxy:
        held = []
        for _ in range(2):
            reader, writer = await asyncio.open_connection(*proxy.addresses[0])
            writer.write(request("token-a"))
            assert (await asyncio.wait_for(read_response(reader), 5))[0] == 403
            held.append((reader, writer))
        reader, writer = await asyncio.open_connection(*proxy.addresses[0])
        writer.write(request("token-b"))
        reply = await asyncio.wait_for(reader.read(-1), 5)
        writer.close()
        assert reply.startswith(b"HTTP/1.1 503 ")
        # a's kept-alive connections are still there and still served
        for reader, writer in held:
            writer.write(request("token-a"))
            assert (await asyncio.wait_for(read_response(reader), 5))[0] == 403
            writer.close()
        record = await audit.wait_for(reason="too_many_connections")
        assert record["mode"] == "http"


async def test_a_stalled_socks_handshake_after_a_good_token_is_recorded() -> None:
    """A SOCKS5 client that authenticates and then sends no request left no record; now
    the proxy's close at the head timeout is recorded with its client id."""
    audit = MemoryAudit()
    spec = ClientSpec("holder", Policy(), token="s3cret")
    settings = Settings(Policy(), clients=(spec,))
    limits = Limits(head_timeout=0.3)
    async with EgressProxy(settings, audit=audit, limits=limits, socks=["127.0.0.1:0"]) as proxy:
        reader, writer = await asyncio.open_connection(*proxy.socks_addresses[0])
        writer.write(b"\x05\x01\x02")
        assert await reader.readexactly(2) == b"\x05\x02"
        writer.write(b"\x01\x06holder\x06s3cret")
        assert await reader.readexactly(2) == b"\x01\x00"
        assert await asyncio.wait_for(reader.read(-1), 10) == b""
        writer.close()
        record = await audit.wait_for(reason="head_timeout")
        assert record["client_id"] == "holder"
        assert record["mode"] == "socks5"
        assert record["end"] == "hello_timeout"


async def test_silent_connections_to_the_http_listener_are_recorded() -> None:
    audit = MemoryAudit()
    async with EgressProxy(Policy(), audit=audit, limits=Limits(head_timeout=0.2)) as proxy:
        reader, writer = await asyncio.open_connection(*proxy.addresses[0])
        assert await asyncio.wait_for(reader.read(-1), 10) == b""
        writer.close()
        record = await audit.wait_for(reason="head_timeout")
        assert record["end"] == "head_timeout"
        assert record["client_id"] is None  # the default client of that source
        assert record["mode"] == "http"


@pytest.mark.netns
async def test_a_hoarder_takes_only_its_own_share_in_every_mode(scene: Scene) -> None:
    """The issue's repro and its other ways to the same result, one after the other: 60
    connections to the hoarder's own SOCKS5 port each sending `\\x05` and stalling, then
    60 silent connections to its own HTTP proxy listener, to port 80 (transparent), and to
    DNS over TCP. Before, they held every slot (`max_connections` 40) and the victim got 503
    through its proxy, a closed SOCKS connection and an empty reply in transparent mode; now
    the hoarder is capped at its share from accept, the victim is served every way, and every
    refusal is recorded - aggregated - with the hoarder's client id, the listener and its
    mode. (One test for the four ways: each needs the sandboxes' namespaces,
    docs/testing.md#which-tests-need-root.)"""
    up = scene.upstream.addr_ns
    cap = scene.proxy.limits.client_cap
    bad_id = scene.bad.client_id
    url = f"http://{up}/"
    ways = {
        "socks5": ("127.0.0.1", 1080, b"\x05"),
        "http": ("127.0.0.1", 3128, b""),
        "transparent": (up, 80, b""),
        "dns": ("127.0.0.1", 53, b""),
    }
    for way, (host, port, first) in ways.items():
        held = await asyncio.to_thread(hoard, scene.hoarder.ns, port, 60, first, host)
        try:
            await wait_refusals(scene.audit, 60 - cap, reason="too_many_connections",
                                client_id=bad_id, mode=way)  # fmt: skip
            assert await curl(scene.victim, "-x", scene.good.proxy_url, url) == "200", way
            socks = await curl(scene.victim, "--socks5-hostname", "127.0.0.1:1080", url)
            assert socks == "200", way
            assert await curl(scene.victim, "--noproxy", "*", url) == "200", way  # transparent
            refused = scene.audit.find(reason="too_many_connections", mode=way)
            assert {r["client_id"] for r in refused} == {bad_id}
            own = {f"{li.host}:{li.port}" for li in scene.bad.listeners if li.kind == way}
            assert {r["listener"] for r in refused} <= own
            assert len(refused) < 60 - cap  # aggregated: far fewer lines than refusals
        finally:
            for s in held:
                s.close()
    assert not scene.audit.find(reason="too_many_connections", client_id=scene.good.client_id)


async def answered(host: str, port: int, source: str) -> int:
    """Open a connection from `source` and ask for a denied host: the status (403: admitted,
    and kept alive, idle, after it) or 0 when the proxy refused it at accept (503, or a
    reset past the first refusals of a second); the connection is left open."""
    try:
        reader, writer = await asyncio.open_connection(host, port, local_addr=(source, 0))
        OPEN.append(writer)
        writer.write(DENIED)
        status, _, _ = await asyncio.wait_for(read_response(reader), 15)
    except (ConnectionError, asyncio.IncompleteReadError, ValueError):  # reset meanwhile
        return 0
    return 0 if int(status) == 503 else int(status)


OPEN: list[asyncio.StreamWriter] = []


async def test_loopback_sources_of_one_host_are_one_client() -> None:
    """Issue 32: on a loopback listener without tokens, each 127.x source was a client of
    its own, with a cap of its own: one process binding five sources, 16 idle connections
    each, filled `max_connections` 64 and locked every other client out. Every loopback
    source of a namespace is one default client (docs/proxy.md#connection-slots): the five
    together hold 16 (the per-client cap), and a sandbox known by its own source still gets
    in. Clients named by a source rule (127.0.10.1 here) keep their own count."""
    sandbox = ClientSpec("sb", Policy(), sources=(ipaddress.ip_network("127.0.10.1/32"),))
    limits = Limits(max_connections=64)
    try:
        async with EgressProxy(Settings(Policy(), clients=(sandbox,)), limits=limits) as proxy:
            host, port = proxy.addresses[0]
            got = [
                await answered(host, port, f"127.0.0.{n}")
                for n in range(2, 7)
                for _ in range(limits.client_cap)
            ]
            assert got.count(403) == limits.client_cap  # before: 64, the proxy full
            assert await answered(host, port, "127.0.10.1") == 403  # before: 503
            assert proxy.steps.slots.count(("source", "loopback")) == limits.client_cap
            assert proxy.steps.slots.count("sb") == 1
    finally:
        for writer in OPEN:
            writer.close()
        OPEN.clear()

"""Bounded resolution (issue 11): names whose DNS never answers stall nobody else.

The dead names are sent, as real DNS queries over UDP, to a resolver that never answers (a
bound socket nobody reads); the lookup blocks in `recv` exactly as `getaddrinfo` does against
a dead server, until the test lets it go. Live names answer from a table (`--resolve`-like).
Before: 8 dead names stalled an unrelated client for 39 s, and the loop's default executor
(netcut's async calls in embedded mode) with it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import struct
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import pytest

from egress import EgressProxy, Policy, Settings
from egress.proxy.net.resolve import ResolveError, Resolver, ResolveTimeout

from proxykit import MemoryAudit, exempt, raw_exchange
from servers import Origin, start_origin

DEAD = [f"dead{i}.test" for i in range(8)]


def dns_query(name: str, qid: int) -> bytes:
    """A standard A query for `name` (RFC 1035 section 4.1)."""
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split("."))
    return struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0) + labels + b"\0" + b"\0\1\0\1"


@dataclass
class DeadResolver:
    """A UDP resolver that never answers, and a lookup function that asks it."""

    live: dict[str, str]
    server: socket.socket = field(init=False)
    released: threading.Event = field(default_factory=threading.Event)
    asked: list[str] = field(default_factory=list)
    waiting: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))

    def __post_init__(self) -> None:
        self.server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.server.bind(("127.0.0.1", 0))

    def lookup(self, host: str) -> list[str]:
        if host in self.live:
            return [self.live[host]]
        self.asked.append(host)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.settimeout(0.05)
            sock.sendto(dns_query(host, len(self.asked)), self.server.getsockname())
            self.waiting.release()
            while not self.released.is_set():
                try:
                    sock.recv(512)  # never comes
                except TimeoutError:
                    continue
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    def wait_asked(self, n: int) -> None:
        for _ in range(n):
            assert self.waiting.acquire(timeout=10)

    def close(self) -> None:
        self.released.set()
        self.server.close()


@pytest.fixture
def dead_dns() -> Iterator[DeadResolver]:
    dns = DeadResolver({"good.test": "127.0.0.1"})
    try:
        yield dns
    finally:
        dns.close()


async def test_resolver_times_out_remembers_and_refuses_when_saturated(
    dead_dns: DeadResolver,
) -> None:
    resolver = Resolver(timeout=0.3, workers=2, negative_ttl=60, lookup=dead_dns.lookup)
    try:
        with pytest.raises(ResolveTimeout, match="no answer within"):
            await resolver.resolve("dead0.test")
        # remembered: no second query for the same dead name
        with pytest.raises(ResolveTimeout):
            await resolver.resolve("dead0.test")
        assert dead_dns.asked == ["dead0.test"]
        # a second dead name takes the other thread; a third cannot queue behind them
        with pytest.raises(ResolveTimeout):
            await resolver.resolve("dead1.test")
        assert resolver.busy == 2
        with pytest.raises(ResolveTimeout, match="resolver busy"):
            await resolver.resolve("good.test")
        # not remembered against the name: once a thread is free, it resolves
        dead_dns.released.set()
        await asyncio.to_thread(_wait_idle, resolver)
        assert await resolver.resolve("good.test") == (ipaddress.ip_address("127.0.0.1"),)
        assert isinstance(ResolveTimeout("x"), ResolveError)
        assert ResolveTimeout.reason == "dns_timeout"
    finally:
        dead_dns.close()
        resolver.close()


def _wait_idle(resolver: Resolver) -> None:
    """Until the released lookups have returned (their threads are joined by the pool)."""
    pool = resolver._executor
    assert pool is not None
    resolver._executor = None
    pool.shutdown(wait=True)


@dataclass
class DnsScene:
    origin: Origin
    proxy: EgressProxy
    audit: MemoryAudit
    dns: DeadResolver


@pytest.fixture
async def dns_scene(dead_dns: DeadResolver) -> AsyncIterator[DnsScene]:
    origin = await start_origin(None, 0)  # on loopback: the guard lets its port through
    dead_dns.live["good.test"] = origin.addr
    audit = MemoryAudit()
    resolver = Resolver(timeout=1.0, workers=16, lookup=dead_dns.lookup)
    settings = exempt(Settings(Policy(default="allow")), origin.port)
    proxy = EgressProxy(settings, listen=["127.0.0.1:0"], audit=audit, resolver=resolver)
    await proxy.start()
    try:
        yield DnsScene(origin, proxy, audit, dead_dns)
    finally:
        dead_dns.close()
        await proxy.stop()
        await origin.close()


async def test_dead_names_do_not_stall_an_unrelated_client(dns_scene: DnsScene) -> None:
    host, port = dns_scene.proxy.addresses[0]
    loop = asyncio.get_running_loop()

    def get(name: str) -> bytes:
        return f"GET http://{name}/ HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n".encode()

    dead = [asyncio.create_task(raw_exchange(host, port, get(n), timeout=10)) for n in DEAD]
    await asyncio.to_thread(dns_scene.dns.wait_asked, len(DEAD))  # all 8 stuck in recv
    # an unrelated client is served while every dead lookup is still unanswered
    answer = await raw_exchange(host, port, get(f"good.test:{dns_scene.origin.port}"))
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert dns_scene.proxy.resolver.busy == len(DEAD)
    assert not any(t.done() for t in dead)
    # ... and so is the loop's default executor (netcut's async calls in embedded mode)
    assert await loop.run_in_executor(None, sum, [1, 2]) == 3

    answers = await asyncio.gather(*dead)
    for raw in answers:
        assert raw.startswith(b"HTTP/1.1 504"), raw[:200]
        assert b"Proxy-Status: egress; error=dns_timeout" in raw
    records = dns_scene.audit.find(reason="dns_timeout")
    assert sorted(str(r["host"]) for r in records) == sorted(DEAD)
    assert all(r["decision"] == "error" and r["status"] == 504 for r in records)

"""Helpers for proxy tests: an in-memory audit sink, raw-socket clients, loopback upstreams,
a real TLS ClientHello."""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import ssl
from dataclasses import dataclass, field

from egress.config import Settings
from egress.policy.rules import Policy


def exempt(settings: Settings | Policy, *ports: int) -> Settings:
    """`settings` whose address guard lets 127.0.0.1 through on exactly these ports.

    For tests that need no root: their upstreams listen on loopback ports of this namespace
    (`servers.start_origin(None, 0)`), and the policy still judges every request as it would a
    test host's (a framework route would skip the policy). Every other loopback port, the
    proxy's own listeners among them, stays reserved (docs/proxy.md#the-address-guard).
    """
    if isinstance(settings, Policy):
        settings = Settings(policy=settings)
    lo = ipaddress.IPv4Address("127.0.0.1")
    guard = settings.guard
    more = frozenset((lo, port) for port in ports)
    guard = dataclasses.replace(guard, exempt=guard.exempt | more)
    return dataclasses.replace(settings, guard=guard)


@dataclass
class MemoryAudit:
    """Collects audit events; `accepting` can be flipped to test fail-closed paths."""

    events: list[dict[str, object]] = field(default_factory=list)
    accepting: bool = True
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    policies: list[dict[str, object]] = field(default_factory=list)  # `type: policy` records

    def record(self, event: dict[str, object]) -> None:
        if event.get("type") == "policy":
            self.policies.append(dict(event))
            return
        self.events.append(dict(event))
        self.changed.set()

    def find(self, **want: object) -> list[dict[str, object]]:
        return [e for e in self.events if all(e.get(k) == v for k, v in want.items())]

    async def wait_for(self, timeout: float = 5.0, **want: object) -> dict[str, object]:
        """The first event with these fields, waiting (event-driven) up to `timeout`."""
        async with asyncio.timeout(timeout):
            while True:
                found = self.find(**want)
                if found:
                    return found[0]
                self.changed.clear()
                await self.changed.wait()


async def raw_exchange(
    host: str, port: int, data: bytes, *, read_until_close: bool = True, timeout: float = 5.0
) -> bytes:
    """Send `data` on a fresh TCP connection and read the answer (until close)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(data)
        await writer.drain()
        async with asyncio.timeout(timeout):
            if read_until_close:
                return await reader.read(-1)
            return await reader.read(65536)
    finally:
        writer.close()


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """Read one HTTP/1.1 response with a Content-Length body."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, headers, body


def client_hello(server_hostname: str | None, **options: object) -> bytes:
    """The bytes Python's TLS client sends first (one record holding its ClientHello), naming
    `server_hostname`; `options` are set on its SSLContext (e.g. `maximum_version`)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    for name, value in options.items():
        setattr(ctx, name, value)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname=server_hostname)
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        return outgoing.read()
    raise AssertionError("a TLS handshake finished with no server answering")

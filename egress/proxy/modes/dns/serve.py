"""The DNS responder's sockets: UDP and TCP on one address, in the proxy's own event loop.

Strategy: every query is answered at once by its exchange, played by the pure front-end
(`query.play`: no upstream resolver, no await), then audited. UDP: one `DatagramProtocol`
per responder. TCP (RFC 7766: two-byte length prefix, several queries per connection): a
listener of kind `dns` served by `serve_dns_tcp`; a connection that stalls mid-message is
closed by the proxy's sweeper after `head_timeout` (phase `hello`). A UDP query costs one
answer of at most a few hundred bytes, so there is nothing to amplify: the answer is never
larger than ~2x the query. See docs/proxy.md#transparent-mode-and-socks5.
"""

from __future__ import annotations

import asyncio
import socket
from typing import TYPE_CHECKING, Protocol

from ...codec.dns import FakeIPs, read_query
from ...core.actions import Done, Refuse
from ...core.clients import Identity
from ...core.exchange import Exchange
from ...core.record import perf_counter_ns
from ...net.conn import read_message
from ...net.listener import Listener, parse_listen, peer_text
from ...net.netns import call_in_netns
from .front import DNS
from .query import play, query_intent, render

if TYPE_CHECKING:
    from ...endpoints import ListenerControl
    from ...net.conn import Conn
    from ...runtime import Steps

MAX_TCP_MESSAGE = 65535  # the two-byte length prefix's own bound


class DnsHost(Protocol):
    """What a DNS responder needs of the proxy that serves it (`EgressProxy` is one): its
    listeners, the address guard's reserve for the fake-IP pool, and the running parts."""

    @property
    def endpoints(self) -> ListenerControl: ...

    @property
    def steps(self) -> Steps: ...

    @property
    def listeners(self) -> list[Listener]: ...

    def reserve(self, network: str) -> None: ...


class _DnsUdp(asyncio.DatagramProtocol):
    def __init__(self, steps: Steps, listener: Listener) -> None:
        self.steps = steps
        self.listener = listener
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str | object, int]) -> None:
        if self.listener.identity is None:  # its sandbox was released
            return
        identity, pool = _sandbox(self.listener)
        response, done = _answer(self.steps, identity, pool, data, peer_text(addr), "udp")
        if response is not None and self.transport is not None:
            self.transport.sendto(response, addr)
        _emit(self.steps, done)


def _sandbox(listener: Listener) -> tuple[Identity, FakeIPs]:
    assert listener.identity is not None
    assert listener.fake_ips is not None
    return listener.identity, listener.fake_ips


def _answer(
    steps: Steps, identity: Identity, pool: FakeIPs, data: bytes, client: str, transport: str
) -> tuple[bytes | None, Done]:
    """One query through its exchange (`query.py`): the answer's bytes (None:
    dropped) and the record to emit."""
    audit = steps.audit
    query = read_query(data)
    audit_ok = audit is None or audit.accepting
    t0 = perf_counter_ns()
    intent = query_intent(query, client, identity, transport, audit_ok=audit_ok, t0=t0)
    action = play(Exchange(steps.gate, DNS), intent, pool)
    return render(query, action), action.done if isinstance(action, Refuse) else action


def _emit(steps: Steps, done: Done) -> None:
    """As `Steps.emit`, for a DNS record: counted by the DNS metrics (docs/metrics.md), not
    in the request metrics nor an execution's summary (docs/audit-log.md#dns-records)."""
    event = done.record.event(done.decision, done.reason, done.rule, done.detail, done.status)
    if steps.audit is not None:
        steps.audit.record(event)
    if steps.metrics is not None:
        steps.metrics.record_dns(event)
    for hook in steps.hooks:
        hook(event)


def _udp_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.bind((host, port))
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


async def open_dns(
    proxy: DnsHost,
    listen: str,
    *,
    identity: Identity,
    fake_ips: FakeIPs,
    netns: str | None = None,
    sockets: tuple[socket.socket, socket.socket] | None = None,
) -> Listener:
    """A DNS responder on `HOST:PORT` (UDP and TCP, inside `netns` if given) answering for
    one sandbox. Port 0 picks a port free for both. `sockets`: its TCP and UDP sockets,
    already opened inside the sandbox's namespace by a helper (docs/user-guide.md#helper-mode).
    Raises OSError / NamespaceError."""
    host, port = parse_listen(listen)
    proxy.reserve(str(fake_ips.network))
    listener = Listener(host, port, netns, identity, kind="dns", fake_ips=fake_ips)
    tcp, udp = sockets if sockets is not None else (None, None)
    listener = await proxy.endpoints.open(listener, tcp)  # TCP first: it fixes an ephemeral port
    try:
        bound = listener.port
        if udp is not None:
            sock = udp
        elif netns:
            sock = await call_in_netns(netns, lambda: _udp_socket(host, bound))
        else:
            sock = _udp_socket(host, bound)
        transport, _ = await proxy.steps.loop.create_datagram_endpoint(
            lambda: _DnsUdp(proxy.steps, listener), sock=sock
        )
    except BaseException:
        proxy.listeners.remove(listener)
        listener.close()
        raise
    listener.datagram = transport
    return listener


async def serve_dns_tcp(steps: Steps, conn: Conn) -> None:
    """Answer length-prefixed queries until the client closes (RFC 7766 pipelining)."""
    conn.side.max_buffer = MAX_TCP_MESSAGE + 2
    while conn.listener.identity is not None:
        identity, pool = _sandbox(conn.listener)
        conn.handshake_begins(steps.loop.time())
        data = await read_message(conn.side, _parse_tcp_message)
        if data is None:
            return
        response, done = _answer(steps, identity, pool, data, conn.client, "tcp")
        if response is not None:
            conn.side.write(len(response).to_bytes(2, "big") + response)
        conn.accounted()
        _emit(steps, done)


def _parse_tcp_message(buf: bytearray) -> tuple[bytes, int] | None:
    if len(buf) < 2:
        return None
    n = int.from_bytes(buf[:2], "big")
    if len(buf) < 2 + n:
        return None
    return bytes(buf[2 : 2 + n]), 2 + n

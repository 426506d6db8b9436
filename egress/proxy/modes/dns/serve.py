"""The DNS responder's sockets: UDP and TCP on one address, in the proxy's own event loop.

Strategy: every query is answered at once by the pure `dnsanswer.answer_query` (no upstream
resolver, no await), then audited. UDP: one `DatagramProtocol` per responder. TCP (RFC 7766:
two-byte length prefix, several queries per connection): a listener of kind `dns` served by
`serve_dns_tcp`; a connection that stalls mid-message is closed by the proxy's sweeper after
`head_timeout` (phase `hello`). A UDP query costs one answer of at most a few hundred bytes,
so there is nothing to amplify: the answer is never larger than ~2x the query.
See docs/proxy.md#transparent-mode-and-socks5.
"""

from __future__ import annotations

import asyncio
import socket
from typing import TYPE_CHECKING

from ...codec.dns import DnsResult, FakeIPs, answer_query, refuse_query
from ...core.clients import Identity
from ...net.conn import read_message
from ...net.listener import Listener, parse_listen, peer_text
from ...net.netns import call_in_netns

if TYPE_CHECKING:
    from ...net.conn import Conn
    from ...runtime import AuditSink, Steps
    from ...server import EgressProxy

MAX_TCP_MESSAGE = 65535  # the two-byte length prefix's own bound


def dns_event(
    client: str, identity: Identity, result: DnsResult, transport: str
) -> dict[str, object]:
    """The audit record of one query (docs/audit-log.md#dns-records)."""
    event: dict[str, object] = {
        "client": client,
        "method": "DNS",
        "scheme": "dns",
        "host": result.host,
        "port": 53,
        "mode": "transparent",
        "transport": transport,
        "client_id": identity.client_id,
        "qtype": result.qtype,
        "rcode": result.rcode,
        "decision": result.decision,
        "reason": result.reason,
        "rule": result.rule,
    }
    if result.answer is not None:
        event["answer"] = result.answer
    if result.detail is not None:
        event["detail"] = result.detail
    if result.would is not None:
        event["would"] = result.would
    return event


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
        result = _answer(self.steps.audit, data, identity, pool)
        if result.response is not None and self.transport is not None:
            self.transport.sendto(result.response, addr)
        _emit(self.steps, dns_event(peer_text(addr), identity, result, "udp"))


def _answer(audit: AuditSink | None, data: bytes, identity: Identity, pool: FakeIPs) -> DnsResult:
    if audit is not None and not audit.accepting:
        return refuse_query(data, "audit log cannot be written")
    return answer_query(data, identity.policy, pool)


def _sandbox(listener: Listener) -> tuple[Identity, FakeIPs]:
    assert listener.identity is not None
    assert listener.fake_ips is not None
    return listener.identity, listener.fake_ips


def _emit(steps: Steps, event: dict[str, object]) -> None:
    """As `Steps.emit`, for a record that is not an `AccessRecord` (a DNS record)."""
    if steps.audit is not None:
        steps.audit.record(event)
    if steps.metrics is not None:  # docs/metrics.md: DNS records are counted too
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
    proxy: EgressProxy,
    listen: str,
    *,
    identity: Identity,
    fake_ips: FakeIPs,
    netns: str | None = None,
) -> Listener:
    """A DNS responder on `HOST:PORT` (UDP and TCP, inside `netns` if given) answering for
    one sandbox. Port 0 picks a port free for both. Raises OSError / NamespaceError."""
    host, port = parse_listen(listen)
    proxy.reserve(str(fake_ips.network))
    listener = Listener(host, port, netns, identity, kind="dns", fake_ips=fake_ips)
    listener = await proxy.endpoints.open(listener)  # TCP first: it fixes an ephemeral port
    try:
        bound = listener.port
        if netns:
            sock = await call_in_netns(netns, lambda: _udp_socket(host, bound))
        else:
            sock = _udp_socket(host, bound)
        transport, _ = await proxy.loop.create_datagram_endpoint(
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
        conn.phase, conn.phase_since = "hello", steps.loop.time()
        data = await read_message(conn.side, _parse_tcp_message)
        if data is None:
            return
        result = _answer(steps.audit, data, identity, pool)
        if result.response is not None:
            conn.side.write(len(result.response).to_bytes(2, "big") + result.response)
        conn.served = True
        _emit(steps, dns_event(conn.client, identity, result, "tcp"))


def _parse_tcp_message(buf: bytearray) -> tuple[bytes, int] | None:
    if len(buf) < 2:
        return None
    n = int.from_bytes(buf[:2], "big")
    if len(buf) < 2 + n:
        return None
    return bytes(buf[2 : 2 + n]), 2 + n

"""The DNS responder: a query's exchange, and its sockets (UDP and TCP on one address, in the
proxy's own event loop).

Strategy: every query is answered at once by its exchange, then audited. A query is read by
the codec (`codec/dns.read_query`), becomes an `Intent` (`query_intent`: method `DNS`, the
name asked, its listener's sandbox), and is played (`play`, no I/O: tested without a socket)
through the same `Exchange` as every other mode, which decides (`Gate.lookup`) and writes the
record; its lookup (`Resolve`) is the sandbox's own fake-address pool, so nothing waits and
nothing is forwarded (no upstream resolver, no await). The answer is the exchange's, in the
mode's table (`kinds.DNS_ANSWERS`), written by the codec (`render`, `respond`). This module
is the only mode that loads dnspython (`codec/dns.py`), with a proxy's first DNS listener.
UDP: one `DatagramProtocol` per responder. TCP (RFC 7766: two-byte length prefix, several
queries per connection): a listener of kind `dns` served by `serve_dns_tcp`; a connection
that stalls mid-message is closed by the proxy's sweeper after `head_timeout` (phase
`hello`). A UDP query costs one answer of at most a few hundred bytes, so there is nothing
to amplify: the answer is never larger than ~2x the query.
See docs/proxy.md#transparent-mode-and-socks5.
"""

from __future__ import annotations

import asyncio
import socket
from typing import TYPE_CHECKING, Protocol

from ...reasons import Reason
from ..codec.dns import FakeIPs, Query, read_query, respond
from ..core.actions import Done, Refuse
from ..core.clients import Identity
from ..core.exchange import Exchange, SequenceError, State
from ..core.gate import AUDIT_DOWN, Verdict
from ..core.intent import Intent, Question
from ..core.record import DnsRecord, perf_counter_ns
from ..net.conn import read_message
from ..net.listener import Listener, parse_listen, peer_text
from ..net.netns import call_in_netns
from .kinds import DNS

if TYPE_CHECKING:
    from ..endpoints import ListenerControl
    from ..net.conn import Conn
    from ..runtime import Steps

MAX_TCP_MESSAGE = 65535  # the two-byte length prefix's own bound


def query_intent(
    query: Query, client: str, identity: Identity, transport: str, *, audit_ok: bool, t0: int
) -> Intent:
    """A query as an `Intent`: a malformed one is a `bad_request` refusal answered with the
    codec's rcode (or not at all: no id, or a response); with the audit log closed, any
    query that can be answered is refused before its question is looked at."""
    problem = query.problem
    if not audit_ok:
        if query.message is not None and (problem is None or problem[0] is not None):
            question = Question("", transport)
            return Intent(
                client, "DNS", "dns", "", 53, t0, None, identity, audit_ok=False, question=question
            )
        problem = (problem[0] if problem is not None else None, AUDIT_DOWN.detail)
    target = None
    answerable = True
    if problem is not None:
        rcode, detail = problem
        target = Verdict(Reason.BAD_REQUEST, detail, status=rcode)
        answerable = rcode is not None
    host = query.host if audit_ok else ""
    qtype = query.qtype if audit_ok else ""
    question = Question(qtype, transport)
    return Intent(
        client,
        "DNS",
        "dns",
        host,
        53,
        t0,
        target,
        identity,
        answerable=answerable,
        question=question,
    )


def play(x: Exchange, intent: Intent, pool: FakeIPs) -> Refuse | Done:
    """The whole exchange of one query, at once: its lookup is the sandbox's own pool (a
    full pool is `pool_exhausted`, SERVFAIL), so nothing is awaited."""
    action = x.start(intent)
    if x.state is State.RESOLVING:  # an A query: its lookup (`Resolve`) is the pool's
        addr = pool.address_for(intent.host)
        if addr is None:
            full = Verdict(Reason.POOL_EXHAUSTED, f"fake address pool {pool.network} is full")
            return x.resolve_failed(full)
        action = x.resolved((addr,))
    if not isinstance(action, Refuse | Done):
        raise SequenceError(f"exchange: {action!r} in a DNS exchange")
    return action


def render(query: Query, action: Refuse | Done) -> bytes | None:
    """The answer to `query` as the exchange ended it (None: dropped, nothing to answer)."""
    if isinstance(action, Refuse):
        answer = action.answer
        return respond(query, answer.code) if answer.style == "dns" else None
    record = action.record
    return respond(query, 0, record.answer if isinstance(record, DnsRecord) else None)


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
    """One query through its exchange (`play`): the answer's bytes (None:
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


__all__ = ["open_dns", "play", "query_intent", "render", "serve_dns_tcp"]

"""CONNECT tunnels and framework-route forwarders: byte relays between two sockets.

Shell. `serve_tunnel` carries out what the gate decided for a CONNECT: answer `200`, check
the TLS ClientHello's SNI when the gate wants it, then relay both directions until they end
(flow control and half-close live in `relay.Side`). `serve_forwarder` relays a forwarder
listener's connection to its framework route. Each ends in one audit record whose `end` says
how the tunnel ended (`reasons.End`).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from ..policy.target import parse_ip_literal
from ..reasons import End, Reason
from . import wire
from .gate import Admit, Refuse, Refused
from .record import AccessRecord, perf_counter_ns
from .relay import RelayEnded, Side
from .responses import CONNECT_OK
from .sni import MAX_HELLO_INPUT, ClientHelloResult, parse_client_hello

if TYPE_CHECKING:
    from ..policy.rules import Policy
    from ..policy.target import Target
    from .conn import Conn
    from .steps import Steps


async def serve_tunnel(steps: Steps, conn: Conn, head: wire.RequestHead) -> None:
    """One CONNECT: target, identity, verdict, dial, `200`, SNI check, relay, record."""
    rec = AccessRecord(conn.client, "CONNECT", "https", head.target, 0, perf_counter_ns())
    upstream: Side | None = None
    try:
        target = steps.gate.connect_target(head.target)
        if isinstance(target, Refuse):
            raise Refused(target)
        rec.host, rec.port = target.host, target.port
        identity = steps.identify(conn, head, rec)
        admitted, addrs = await steps.authorize(identity.policy, target, rec)
        upstream, addr = await steps.pool.dial(addrs, target.port)
        conn.upstream = upstream
        rec.addr = steps.addr_text(addr)
        steps.opened(conn, rec)
        conn.side.write(CONNECT_OK)
        rec.status = 200
        await check_sni(steps, conn, identity.policy, target, admitted, rec)
    except Refused as refused:
        steps.answer(conn, rec, refused.refusal)
        if upstream is not None:
            upstream.close()
        return
    await relay_tunnel(steps, conn, upstream, rec)


async def check_sni(
    steps: Steps, conn: Conn, policy: Policy, target: Target, admitted: Admit, rec: AccessRecord
) -> None:
    """The TLS SNI check of an open tunnel (docs/proxy.md#tls-sni-check), where the gate wants
    one: read the ClientHello, record its SNI, and refuse (or, report-only, record) what the
    policy would not allow. Shared by CONNECT and SOCKS5."""
    if not steps.gate.wants_sni(policy, target):
        return
    hello = await read_hello(steps, conn)
    if hello is not None and hello.sni is not None and hello.kind == "tls":
        rec.sni = hello.sni
    verdict = steps.gate.sni(policy, target, admitted, hello)
    if isinstance(verdict, Refuse):
        report_would_block(policy.report_only, rec, verdict)


def report_would_block(report_only: bool, rec: AccessRecord, verdict: Refuse) -> None:
    """An SNI refusal: raised, or under report-only the tunnel goes on and the record says
    what would have happened (the first would-be refusal: the policy's, else the SNI
    check's; docs/audit-log.md#report-only-fields). Shared by CONNECT, SOCKS5, transparent."""
    if not report_only:
        raise Refused(verdict)
    if rec.would is None:
        rec.would, rec.reason, rec.rule = "block", verdict.reason.value, None
        rec.detail = f"report-only, would block: {verdict.detail}"


async def read_hello(steps: Steps, conn: Conn) -> ClientHelloResult | None:
    """The tunnel's first bytes as a ClientHello (None: the client sent none and closed);
    the sweeper ends this wait after the head timeout (`hello_timeout`)."""
    side = conn.side
    conn.phase, conn.phase_since = "hello", steps.loop.time()
    side.max_buffer = MAX_HELLO_INPUT  # a ClientHello may be larger than a request head
    while True:
        hello = parse_client_hello(side.buf)
        if hello is not None or not await side.read_more():
            break
    side.max_buffer = steps.limits.max_head
    conn.phase = "active"
    return hello


async def relay_tunnel(
    steps: Steps,
    conn: Conn,
    upstream: Side | None,
    rec: AccessRecord,
    status: int | None = 200,
) -> None:
    """Relay both directions until both end (or one fails), then write the record
    (`status` None: SOCKS5 and transparent tunnels have no HTTP status)."""
    assert upstream is not None
    conn.relaying = (
        rec  # re-judged if its client's policy changes (docs/policy.md#live-policy-changes)
    )
    metrics = steps.metrics
    if metrics is not None:
        metrics.open_tunnels += 1
    up = conn.side.start_relay(upstream, None)
    down = upstream.start_relay(conn.side, None)
    try:
        await _both_or_failure(up, down)
    finally:
        if metrics is not None:
            metrics.open_tunnels -= 1
    # who went away first, read before we close either side (docs/audit-log.md#end)
    gone = "client" if conn.side.lost else "upstream" if upstream.lost else None
    if not (up.done() and down.done()):
        conn.side.close()
        upstream.close()
        await asyncio.wait((up, down), timeout=1.0)
    how = _how_ended(up, down)  # always: it also retrieves both futures' exceptions
    end = conn.end or how
    if end == End.LOST.value and gone is not None:
        end = End.CLIENT_CLOSED.value if gone == "client" else End.UPSTREAM_CLOSED.value
    upstream.close()
    rec.bytes_up = conn.side.bytes_relayed
    rec.bytes_down = upstream.bytes_relayed
    rec.end = end
    rec.finish()
    steps.emit(rec, "allow", rec.reason or "", rec.rule, None, status)


async def serve_forwarder(steps: Steps, conn: Conn, forward_to: tuple[str, int]) -> None:
    """A forwarder connection: relay it to the listener's framework route."""
    host, port = forward_to
    rec = AccessRecord(conn.client, "FORWARD", "tcp", host, port, perf_counter_ns())
    bound = conn.listener.identity
    rec.identify(bound.client_id if bound is not None else None)
    # no `policy` hash: the route decides, not a policy the log ever recorded
    # (docs/audit-log.md#request-records)
    conn.phase, conn.served = "active", True
    try:
        steps.check_audit()
        ip = parse_ip_literal(host)
        addrs = (ip,) if ip is not None else await steps.resolve(host)
        upstream, addr = await steps.pool.dial(addrs, port)
    except Refused as refused:
        rec.finish()
        r = refused.refusal
        steps.emit(rec, r.decision, r.reason.value, None, r.detail, None)
        return
    conn.upstream = upstream
    rec.addr = steps.addr_text(addr)
    steps.opened(conn, rec)
    rec.admitted(Reason.FRAMEWORK_ROUTE.value, f"http://{host}:{port}")
    await relay_tunnel(steps, conn, upstream, rec)


async def _both_or_failure(a: asyncio.Future[None], b: asyncio.Future[None]) -> None:
    """Wait until both futures are done, or one failed (cheaper than `asyncio.wait`)."""
    if a.done() and b.done():
        return
    waiter: asyncio.Future[None] = a.get_loop().create_future()

    def check(_: object) -> None:
        if waiter.done():
            return
        failed = any(f.done() and (f.cancelled() or f.exception()) for f in (a, b))
        if failed or (a.done() and b.done()):
            waiter.set_result(None)

    a.add_done_callback(check)
    b.add_done_callback(check)
    check(None)
    await waiter


def _how_ended(up: asyncio.Future[None], down: asyncio.Future[None]) -> str:
    """`eof` for a clean end both ways, else the first direction's failure reason."""
    reasons = []
    for fut in (up, down):
        if not fut.done():
            fut.cancel()
        elif not fut.cancelled():
            exc = fut.exception()  # also marks it retrieved
            if isinstance(exc, RelayEnded):
                reasons.append(exc.reason)
    return reasons[0] if reasons else End.EOF.value


__all__ = ["read_hello", "relay_tunnel", "report_would_block", "serve_forwarder", "serve_tunnel"]

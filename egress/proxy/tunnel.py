"""CONNECT tunnels and framework-route forwarders: byte relays between two sockets.

Shell. `serve_tunnel` is the CONNECT front-end: it turns the request head into an `Intent`
(the gate's target and identity) and lets the driver carry out the exchange (`driver.drive`:
decide, resolve, dial, `200`, the SNI check); `serve_forwarder` does the same for a
forwarder listener's connection to its framework route. `relay_tunnel` then relays both
directions until they end (flow control and half-close live in `relay.Side`) and hands the
exchange how the tunnel ended (`reasons.End`) for its one record.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from ..reasons import End
from . import wire
from .core.exchange import Exchange
from .core.intent import Intent
from .driver import drive
from .gate import Refuse
from .modes.connect import CONNECT
from .modes.forwarder import FORWARDER
from .record import perf_counter_ns
from .relay import RelayEnded

if TYPE_CHECKING:
    from .conn import Conn
    from .steps import Steps


async def serve_tunnel(steps: Steps, conn: Conn, head: wire.RequestHead) -> None:
    """One CONNECT: target, identity, then the exchange (verdict, dial, `200`, SNI, relay)."""
    t0 = perf_counter_ns()
    gate = steps.gate
    target = gate.connect_target(head.target)
    identity = cap = None
    if not isinstance(target, Refuse):
        identity = gate.identify(conn.listener.identity, conn.peer, head)
        cap = steps.cap(conn, identity)
    audit = steps.audit
    intent = Intent(
        conn.client,
        "CONNECT",
        "https",
        head.target,
        0,
        t0,
        target,
        identity,
        cap,
        audit_ok=audit is None or audit.accepting,
    )
    x = Exchange(gate, CONNECT)
    if await drive(steps, conn, x, x.start(intent)) is not None:
        await relay_tunnel(steps, conn, x)


async def relay_tunnel(steps: Steps, conn: Conn, x: Exchange) -> None:
    """Relay both directions until both end (or one fails), then end the exchange with how
    it ended and the bytes each way, and write its record."""
    upstream = conn.upstream
    assert upstream is not None
    # re-judged if its client's policy changes (docs/policy.md#live-policy-changes)
    conn.relaying = x.record
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
    steps.done(x.ended(end, conn.side.bytes_relayed, upstream.bytes_relayed))


async def serve_forwarder(steps: Steps, conn: Conn, forward_to: tuple[str, int]) -> None:
    """A forwarder connection: relay it to the listener's framework route. No `policy`
    hash in its records: the route decides, not a policy the log ever recorded
    (docs/audit-log.md#request-records)."""
    host, port = forward_to
    conn.phase, conn.served = "active", True
    audit = steps.audit
    intent = Intent(
        conn.client,
        "FORWARD",
        "tcp",
        host,
        port,
        perf_counter_ns(),
        None,
        conn.listener.identity,
        audit_ok=audit is None or audit.accepting,
    )
    x = Exchange(steps.gate, FORWARDER)
    if await drive(steps, conn, x, x.start(intent)) is not None:
        await relay_tunnel(steps, conn, x)


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


__all__ = ["relay_tunnel", "serve_forwarder", "serve_tunnel"]

"""A tunnel's relay, shared by both drivers: two relay directions, then `Exchange.ended`.

Shell. `relay_tunnel` relays both directions until they end (flow control and half-close
live in `net.relay.Side`); the callback driver (`drive.callback.Carrier`) does the same from
callbacks with the same pieces (`open_relay`, `relay_over`, `who_left`, `cut`, `end_relay`),
and hands what must wait to `carry_on`, which carries an exchange out on the coroutine
(docs/architecture.md#the-callback-driver). CONNECT (`modes.connect`), forwarder,
SOCKS5 and transparent tunnels end here. The exchange gets how the tunnel ended
(`reasons.End`) for its one record.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from ...reasons import End
from ..core.actions import Action
from ..core.exchange import Exchange
from ..net.relay import RelayEnded
from .coroutine import drive

if TYPE_CHECKING:
    from ..net.conn import Conn
    from ..runtime import Steps


async def carry_on(steps: Steps, conn: Conn, x: Exchange, action: Action) -> None:
    """A tunnel's exchange from `action` on, on the coroutine (also where the callback
    driver hands over what must wait: a name not in the resolver's cache)."""
    if await drive(steps, conn, x, action) is not None:
        await relay_tunnel(steps, conn, x)


async def relay_tunnel(steps: Steps, conn: Conn, x: Exchange) -> None:
    """Relay both directions until both end (or one fails), then end the exchange with how
    it ended and the bytes each way, and write its record."""
    up, down = open_relay(steps, conn, x)
    try:
        await _both_or_failure(up, down)
        gone = who_left(conn)
        if not (up.done() and down.done()):
            cut(conn)
            await asyncio.wait((up, down), timeout=1.0)
    except BaseException:
        _closed(steps)
        raise
    end_relay(steps, conn, x, (up, down), gone)


def open_relay(
    steps: Steps, conn: Conn, x: Exchange
) -> tuple[asyncio.Future[None], asyncio.Future[None]]:
    """Start relaying both ways (each direction's future ends with it)."""
    upstream = conn.upstream
    assert upstream is not None
    # re-judged if its client's policy changes (docs/policy.md#live-policy-changes)
    conn.relays(x.record)
    metrics = steps.metrics
    if metrics is not None:
        metrics.open_tunnels += 1
    return conn.side.start_relay(upstream, None), upstream.start_relay(conn.side, None)


def relay_over(up: asyncio.Future[None], down: asyncio.Future[None]) -> bool:
    """Both directions ended, or one failed: the tunnel is over."""
    if up.done() and down.done():
        return True
    return any(f.done() and (f.cancelled() or f.exception() is not None) for f in (up, down))


def who_left(conn: Conn) -> str | None:
    """Who went away first, read before we close either side (docs/audit-log.md#end)."""
    upstream = conn.upstream
    if conn.side.lost:
        return "client"
    return "upstream" if upstream is not None and upstream.lost else None


def cut(conn: Conn) -> None:
    """Close both sides of a tunnel one direction of which failed."""
    conn.side.close()
    if conn.upstream is not None:
        conn.upstream.close()


def end_relay(
    steps: Steps,
    conn: Conn,
    x: Exchange,
    futures: tuple[asyncio.Future[None], asyncio.Future[None]],
    gone: str | None,
) -> None:
    """The relay is over: end the exchange with how it ended, write its record."""
    _closed(steps)
    upstream = conn.upstream
    assert upstream is not None
    up, down = futures
    how = _how_ended(up, down)  # always: it also retrieves both futures' exceptions
    end = conn.end or how
    if end == End.LOST.value and gone is not None:
        end = End.CLIENT_CLOSED.value if gone == "client" else End.UPSTREAM_CLOSED.value
    upstream.close()
    steps.done(x.ended(end, conn.side.bytes_relayed, upstream.bytes_relayed))


def _closed(steps: Steps) -> None:
    metrics = steps.metrics
    if metrics is not None:
        metrics.open_tunnels -= 1


async def _both_or_failure(a: asyncio.Future[None], b: asyncio.Future[None]) -> None:
    """Wait until both futures are done, or one failed (cheaper than `asyncio.wait`)."""
    if a.done() and b.done():
        return
    waiter: asyncio.Future[None] = a.get_loop().create_future()

    def check(_: object) -> None:
        if waiter.done():
            return
        if relay_over(a, b):
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


__all__ = [
    "carry_on",
    "cut",
    "end_relay",
    "open_relay",
    "relay_over",
    "relay_tunnel",
    "who_left",
]

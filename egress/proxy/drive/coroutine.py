"""The async driver: carries out an `Exchange`'s actions on a connection's coroutine.

Shell. The exchange (`core/exchange.py`, pure) decides what comes next; this is the one place
that turns its actions into I/O for every front-end: resolve (with the DNS timings), dial
(never raising: the callback driver's own `Dialer` reports a refusal), the `ReplyOk` and
refusals rendered by the answer's style (an HTTP response, an RFC 1928 reply, a reset, a
close), the ClientHello read, and the record emitted at the end (docs/architecture.md#one-exchange).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from ...reasons import End
from ..codec import socks5 as socks5_codec
from ..codec.tls_hello import MAX_HELLO_INPUT, ClientHelloResult, parse_client_hello
from ..core.actions import Action, Dial, Done, ReadHello, Refuse, Relay, ReplyOk, Resolve
from ..core.exchange import Exchange
from ..core.gate import Refuse as Verdict
from ..core.intent import Answer
from ..core.record import perf_counter_ns, seconds_since
from ..core.responses import CONNECT_OK
from ..core.revocation import revoked_by
from ..modes.http.front import render_refusal
from ..net.dialer import Dialer
from ..net.resolve import ResolveError

if TYPE_CHECKING:
    from ...policy.target import IPAddress
    from ..net.conn import Conn
    from ..net.relay import Side
    from ..runtime import Steps


async def drive(
    steps: Steps,
    conn: Conn,
    x: Exchange,
    action: Action,
    keep: Callable[[Verdict], bool] | None = None,
    before_pooled: Callable[[], Awaitable[None]] | None = None,
) -> Relay | None:
    """Carry out `action` and the ones after it until the exchange relays (the `Relay` is
    returned: the caller relays) or ended (None: answered, recorded). `keep`: whether the
    client connection survives a refusal (requests: `gate.keep_alive_after`);
    `before_pooled`: awaited before a request's upstream is taken (its client's fair
    share, docs/proxy.md#fair-share)."""
    timed = False
    metrics = steps.metrics
    while True:
        if isinstance(action, Resolve):
            action = await _resolve(steps, x, action)
            continue
        if not timed and x.decided:
            timed = True
            if metrics is not None:  # parsed head -> verdict (docs/metrics.md)
                metrics.decision.observe(seconds_since(x.record.t0))
        if isinstance(action, Dial):
            if action.pooled and before_pooled is not None:
                await before_pooled()
            idle = steps.pool.take_idle(action.addrs, action.port) if action.pooled else None
            found = idle if idle is not None else await dial(steps, conn, action)
            if isinstance(found, tuple):
                conn.upstream, addr = found
                action = x.dialed(addr, steps.addr_text(addr))
                steps.link(conn, x)
            else:
                action = x.dial_failed(found)
        elif isinstance(action, ReplyOk):
            conn.side.write(ok_bytes(action.answer))
            action = x.replied()
        elif isinstance(action, ReadHello):
            action = x.hello(await read_hello(steps, conn))
        elif isinstance(action, Refuse):
            refuse(steps, conn, action, close=keep is None or not keep(action.verdict))
            return None
        elif isinstance(action, Relay):
            if conn.recheck is not None and revoked_meanwhile(steps, conn, x):
                return None
            return action
        elif isinstance(action, Done):
            steps.done(action)
            return None


async def dial(steps: Steps, conn: Conn, action: Dial) -> tuple[Side, IPAddress] | Verdict:
    """Connect to the first reachable checked address (the last failure's refusal when none
    answered) with the callback driver's `Dialer`: one dial for both drivers, so the sweeper
    times it out and a stopping proxy gives it up (`Dialer.cancel`, recorded as failed) on
    either (docs/proxy.md#limits)."""
    found: asyncio.Future[tuple[Side, IPAddress] | Verdict] = steps.loop.create_future()

    def done(outcome: tuple[Side, IPAddress] | Verdict) -> None:
        if not found.done():
            found.set_result(outcome)
        elif isinstance(outcome, tuple):  # this task was cancelled meanwhile: nobody's
            outcome[0].close()

    dialer = Dialer(steps.loop, action.addrs, action.port, done, steps.metrics)
    conn.dialing = dialer
    try:
        dialer.start()
        return await found
    finally:
        conn.dialing = None
        dialer.cancel()  # (a no-op once it reported)


def revoked_meanwhile(steps: Steps, conn: Conn, x: Exchange) -> bool:
    """A policy changed while this exchange was judged, resolved or dialed under the old
    one: judge it again, now that its address is known, before anything is relayed; if
    the new policy refuses it, it is cut and recorded `end: revoked`
    (docs/policy.md#live-policy-changes). Both drivers call it at `Relay`."""
    policies, conn.recheck = conn.recheck, None
    assert policies is not None
    if revoked_by(policies, steps.gate.guard, x.record) is None:
        return False
    conn.end = End.REVOKED.value
    conn.side.abort()
    if conn.upstream is not None:
        conn.upstream.abort()
    steps.done(x.ended(conn.end, 0, 0))
    return True


async def _resolve(steps: Steps, x: Exchange, action: Resolve) -> Action:
    metrics = steps.metrics
    t0 = perf_counter_ns() if metrics is not None else 0
    try:
        addrs = await steps.resolver.resolve(action.host)
    except (ResolveError, TimeoutError) as exc:
        return x.resolve_failed(exc)
    finally:
        if metrics is not None:
            metrics.dns.observe(seconds_since(t0))
    return x.resolved(addrs)


async def read_hello(steps: Steps, conn: Conn) -> ClientHelloResult | None:
    """The tunnel's first bytes as a ClientHello (None: the client sent none and closed);
    the sweeper ends this wait after the head timeout (`hello_timeout`)."""
    side = conn.side
    conn.phase, conn.phase_since = "hello", steps.loop.time()
    side.max_buffer = MAX_HELLO_INPUT  # a ClientHello may be larger than a request head
    side.want_more()
    while True:
        hello = parse_client_hello(side.buf)
        if hello is not None or not await side.read_more():
            break
    side.max_buffer = steps.limits.max_head
    conn.phase = "active"
    return hello


def ok_bytes(answer: Answer) -> bytes:
    """What tells the client its tunnel is open, in its front-end's protocol."""
    if answer.style == "socks5":
        return socks5_codec.reply(answer.code)
    return CONNECT_OK


def refuse(steps: Steps, conn: Conn, action: Refuse, *, close: bool = True) -> None:
    """Answer a refusal in its front-end's protocol, close the upstream, emit the record."""
    answer = action.answer
    if answer.style == "http":
        conn.side.write(render_refusal(action, close=close))
    elif answer.style == "socks5":
        conn.side.write(socks5_codec.reply(answer.code))
    elif answer.style == "reset":
        conn.side.abort()  # RST: there is no protocol to answer in
    if conn.upstream is not None:
        conn.upstream.close()
    steps.done(action.done)


__all__ = ["dial", "drive", "ok_bytes", "read_hello", "refuse", "revoked_meanwhile"]

"""The async driver: supplies the waiting for an `Exchange`'s actions on a coroutine.

Shell. The exchange (`core/exchange.py`, pure) decides what comes next and the executor
(`drive/executor.py`) carries each action out; this driver only awaits what the executor
says it waits for: a lookup (with the DNS timings), a fair-share turn, a dial (the callback
driver's own `Dialer`, awaited on a future), more of a ClientHello
(docs/architecture.md#one-executor).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from ..codec.tls_hello import MAX_HELLO_INPUT, ClientHelloResult, parse_client_hello
from ..core.actions import Action, Relay
from ..core.exchange import Exchange
from ..core.gate import Verdict
from ..core.record import perf_counter_ns, seconds_since
from ..net.resolve import ResolveError
from .executor import DIAL, END, HELLO, LOOKUP, RELAY, TURN, Executor, Wait
from .executor import ok_bytes as ok_bytes
from .executor import refuse as refuse
from .executor import revoked_meanwhile as revoked_meanwhile

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
    ex = Executor(steps, conn, x, keep=keep, turn=before_pooled is not None)
    step: Action | Wait = action
    while True:
        if step.__class__ is not Wait:
            step = ex.carry_out(step)  # type: ignore[arg-type]
        elif step is LOOKUP:
            assert ex.lookup is not None
            step = await _resolve(steps, x, ex.lookup.host)
        elif step is TURN:
            assert before_pooled is not None
            assert ex.dial is not None
            await before_pooled()
            step = ex.dial
        elif step is DIAL:
            step = ex.dialed(await _dial(steps, conn, ex))
        elif step is HELLO:
            await conn.side.read_more()
            step = ex.hello_more()
        elif step is RELAY:
            return ex.relay
        else:
            assert step is END, step
            return None


async def _dial(steps: Steps, conn: Conn, ex: Executor) -> tuple[Side, IPAddress] | Verdict:
    """The executor's dial (`Dialer`, started) awaited: one dial for both drivers, so the
    sweeper times it out and a stopping proxy gives it up (`Dialer.cancel`, recorded as
    failed) on either (docs/proxy.md#limits)."""
    outcome = ex.outcome
    if outcome is not None:  # it reported as it started
        return outcome
    found: asyncio.Future[tuple[Side, IPAddress] | Verdict] = steps.loop.create_future()

    def woken() -> None:
        got = ex.outcome
        assert got is not None
        if not found.done():
            found.set_result(got)
        elif isinstance(got, tuple):  # this task was cancelled meanwhile: nobody's
            got[0].close()

    ex.woken = woken
    try:
        return await found
    finally:
        dialer = conn.dial_over()
        if dialer is not None:
            dialer.cancel()  # (a no-op once it reported)


async def _resolve(steps: Steps, x: Exchange, host: str) -> Action:
    """A name not in the resolver's cache, looked up (and timed: docs/metrics.md)."""
    metrics = steps.metrics
    t0 = perf_counter_ns() if metrics is not None else 0
    try:
        addrs = await steps.resolver.resolve(host)
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
    conn.handshake_begins(steps.loop.time())
    side.max_buffer = MAX_HELLO_INPUT  # a ClientHello may be larger than a request head
    side.want_more()
    while True:
        hello = parse_client_hello(side.buf)
        if hello is not None or not await side.read_more():
            break
    side.max_buffer = steps.limits.max_head
    conn.handshake_done()
    return hello


__all__ = ["drive", "ok_bytes", "read_hello", "refuse", "revoked_meanwhile"]

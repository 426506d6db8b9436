"""The one executor: every action an `Exchange` returns is carried out here, and only here.

Shell. `Executor.carry_out(action)` is the one place that turns an action into I/O (the model
is mitmproxy's `ConnectionHandler.server_event`): an exhaustive `match` over the action types
that ends in a raise, so an action no case names is a bug that says so at once, never a loop
that spins nor an exchange silently ended. It never waits: an action that needs a wait (a
name not in the resolver's cache, its client's fair-share turn, a dial, more of a
ClientHello, the relay) starts what it can and returns a `Wait` naming what is awaited; the
driver supplies only the waiting (`drive/coroutine.py` awaits, `drive/callback.py` registers a
callback) and resumes the exchange with the result (`dialed`, `hello_more`, or the
exchange's own `resolved`/`resolve_failed`): docs/architecture.md#one-executor.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, Final

from ...reasons import End
from ..codec import socks5 as socks5_codec
from ..codec.tls_hello import MAX_HELLO_INPUT, parse_client_hello
from ..core.actions import Action, Dial, Done, ReadHello, Refuse, Relay, ReplyOk, Resolve
from ..core.exchange import Exchange
from ..core.gate import Verdict
from ..core.intent import Answer
from ..core.record import seconds_since
from ..core.responses import CONNECT_OK, render_refusal
from ..core.revocation import revoked_by
from ..net.dialer import Dialer

if TYPE_CHECKING:
    from ...policy.target import IPAddress
    from ..net.conn import Conn
    from ..net.relay import Side
    from ..runtime import Steps


class Wait(Enum):
    """What the driver waits for before it resumes the exchange (`Executor.carry_out`)."""

    LOOKUP = "lookup"  # a name not in the resolver's cache: `lookup` is its `Resolve`
    TURN = "turn"  # its client's turn before a pooled upstream: carry `dial` out again
    DIAL = "dial"  # a dial started (its outcome to `woken`), or none allowed (`dials` off)
    HELLO = "hello"  # more ClientHello bytes, or the client's end: then `hello_more`
    RELAY = "relay"  # the exchange relays (`relay` is its `Relay`): the driver's to do
    END = "end"  # answered or cut, and recorded: nothing is left to do


LOOKUP: Final = Wait.LOOKUP
TURN: Final = Wait.TURN
DIAL: Final = Wait.DIAL
HELLO: Final = Wait.HELLO
RELAY: Final = Wait.RELAY
END: Final = Wait.END


class Executor:
    """Carries out one exchange's actions for a driver (see the module docstring).

    `keep`: whether the client connection survives a refusal (requests:
    `gate.keep_alive_after`; None: it never does); `turn`: a fair-share turn is taken
    before a pooled upstream (`Wait.TURN`, once); `dials`: a dial may be started (the fast
    path's may not: it leaves the request to the coroutine); `timed`: the metrics are the
    driver's to observe (False: the fast path observes them once the request is its own)."""

    __slots__ = (
        "cache_hit",
        "conn",
        "dial",
        "dials",
        "keep",
        "lookup",
        "metrics",
        "outcome",
        "relay",
        "steps",
        "timed",
        "turn",
        "woken",
        "x",
    )

    def __init__(
        self,
        steps: Steps,
        conn: Conn,
        x: Exchange,
        *,
        keep: Callable[[Verdict], bool] | None = None,
        turn: bool = False,
        dials: bool = True,
        timed: bool = True,
    ) -> None:
        self.steps = steps
        self.conn = conn
        self.x = x
        self.keep = keep
        self.turn = turn
        self.dials = dials
        self.metrics = steps.metrics if timed else None
        self.timed = not timed  # the decision's time is observed once (docs/metrics.md)
        self.cache_hit = False  # the name came from the resolver's cache
        self.lookup: Resolve | None = None  # awaited: `Wait.LOOKUP`
        self.dial: Dial | None = None  # awaited: `Wait.TURN` (then carried out again)
        self.relay: Relay | None = None  # `Wait.RELAY`: what the driver relays
        self.outcome: tuple[Side, IPAddress] | Verdict | None = None  # a dial's, until taken
        self.woken: Callable[[], None] | None = None  # told when a dial reported

    def carry_out(self, action: Action) -> Action | Wait:
        """Carry out `action`: the exchange's next action, or what the driver waits for."""
        steps, conn, x = self.steps, self.conn, self.x
        match action:
            case Resolve(host=host):
                addrs = steps.resolver.cached(host)
                if addrs is None:
                    self.lookup = action
                    return LOOKUP
                self.cache_hit = True
                if self.metrics is not None:  # a cache hit: answered without a wait
                    self.metrics.dns.observe(0.0)
                return x.resolved(addrs)
            case Dial(addrs=addrs, port=port, pooled=pooled):
                if not self.timed:
                    self._decision()
                if pooled:
                    if self.turn:
                        self.turn = False
                        self.dial = action
                        return TURN
                    idle = steps.pool.take_idle(addrs, port)
                    if idle is not None:  # `dialed`, inline: every kept-alive request's
                        upstream, addr = idle
                        conn.connected(upstream, x.record)
                        relay = x.dialed(addr, steps.addr_text(addr))
                        steps.link(conn, x)
                        return relay
                if not self.dials:
                    return DIAL
                dialer = Dialer(steps.loop, addrs, port, self._reported, steps.metrics)
                conn.dial_started(dialer)
                dialer.start()
                return DIAL
            case ReplyOk(answer=answer):
                conn.side.write(ok_bytes(answer))
                return x.replied()
            case ReadHello():
                side = conn.side
                conn.handshake_begins(steps.loop.time())
                side.max_buffer = MAX_HELLO_INPUT  # a ClientHello may be larger than a head
                side.want_more()
                return self.hello_more()
            case Refuse(verdict=verdict):
                if not self.timed:
                    self._decision()
                keep = self.keep
                refuse(steps, conn, action, close=keep is None or not keep(verdict))
                return END
            case Relay():
                if conn.recheck is not None and revoked_meanwhile(steps, conn, x):
                    return END
                self.relay = action
                return RELAY
            case Done():
                if not self.timed:
                    self._decision()
                steps.done(action)
                return END
            case _:
                raise RuntimeError(f"unexpected action {action!r}")

    def _decision(self) -> None:
        """Parsed head -> verdict, once the policy judged it (docs/metrics.md)."""
        x = self.x
        if x.decided:
            self.timed = True
            if self.metrics is not None:
                self.metrics.decision.observe(seconds_since(x.record.t0))

    # --- resuming: what the drivers report back ----------------------------------------------
    def dialed(self, outcome: tuple[Side, IPAddress] | Verdict) -> Action:
        """A dial's outcome (or an idle pooled upstream): the exchange's next action."""
        conn, x = self.conn, self.x
        conn.dial_over()
        self.outcome = None
        if isinstance(outcome, tuple):
            upstream, addr = outcome
            conn.connected(upstream, x.record)
            relay = x.dialed(addr, self.steps.addr_text(addr))
            self.steps.link(conn, x)
            return relay
        return x.dial_failed(outcome)

    def _reported(self, outcome: tuple[Side, IPAddress] | Verdict) -> None:
        """The `Dialer`'s report (also from `start`, before any driver waits): kept for
        the driver, which is told if it is waiting already."""
        self.outcome = outcome
        woken = self.woken
        if woken is not None:
            woken()

    def hello_more(self) -> Action | Wait:
        """The ClientHello read so far (None once the client ended without one): the
        exchange's next action, or `Wait.HELLO` for more bytes; the sweeper ends this wait
        after the head timeout (`hello_timeout`)."""
        conn = self.conn
        side = conn.side
        hello = parse_client_hello(side.buf)
        if hello is None and not side.eof:
            side.want_more()
            return HELLO
        side.max_buffer = self.steps.limits.max_head
        conn.handshake_done()
        return self.x.hello(hello)


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


def revoked_meanwhile(steps: Steps, conn: Conn, x: Exchange) -> bool:
    """A policy changed while this exchange was judged, resolved or dialed under the old
    one: judge it again, now that its address is known, before anything is relayed; if
    the new policy refuses it, it is cut and recorded `end: revoked`
    (docs/policy.md#live-policy-changes). Carried out at every `Relay`."""
    policies = conn.take_changes()
    assert policies is not None
    if revoked_by(policies, steps.gate.guard, x.record) is None:
        return False
    conn.cut_by(End.REVOKED)
    conn.side.abort()
    if conn.upstream is not None:
        conn.upstream.abort()
    steps.done(x.ended(End.REVOKED.value, 0, 0))
    return True


__all__ = [
    "DIAL",
    "END",
    "HELLO",
    "LOOKUP",
    "RELAY",
    "TURN",
    "Executor",
    "Wait",
    "ok_bytes",
    "refuse",
    "revoked_meanwhile",
]

"""The synchronous driver: exchanges carried out from protocol callbacks, without a task.

Two kinds: a kept-alive absolute-form request (the callback fast path, `drive/fastpath.py`,
served from `FastClient.data_received`), and a CONNECT's whole tunnel set-up when it is a
connection's first head (`Carrier`: accept without a task, decide, dial, `200`, SNI, relay;
docs/architecture.md#the-callback-driver).

Shell. `FastClient` is the client connection's `Side` that can do both: it holds back its
wake-ups while a kept-alive request is in flight or waits for its client's turn, and serves
a first CONNECT head itself; anything else is the connection's coroutine's, which parses the
buffered bytes again and serves them as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from ...errors import ProtocolError
from ..codec import http1 as wire
from ..core.actions import Action
from ..core.kept import Kept
from ..fairshare import Ticket, Waiter
from ..modes.connect import connect_exchange
from ..net.relay import Side
from .executor import DIAL, END, HELLO, LOOKUP, RELAY, Executor, Wait
from .fastpath import FastExchange, begin
from .tunnel import carry_on, cut, end_relay, open_relay, relay_over, who_left

if TYPE_CHECKING:
    from ..net.conn import Conn
    from ..runtime import Steps

log = logging.getLogger("egress")

# starts a connection's coroutine: from its first head (None), or to carry on an exchange
Spawn = Callable[["Conn", "Coroutine[Any, Any, None] | None"], None]


class FastClient(Side):
    """A client connection's `Side` that can serve kept-alive requests from callbacks, and a
    CONNECT's whole tunnel when it is the first head (`Carrier`)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, max_buffer: int = 65536) -> None:
        super().__init__(loop, max_buffer)
        self.fast: FastExchange | None = None
        self.executor: Executor | None = None  # its kept-alive requests' (`begin`)
        self.kept: Kept | None = None  # its last request's decision (`core/kept.py`)
        self.conn: Conn | None = None  # set once accepted
        self.steps: Steps | None = None
        # set while no coroutine serves it yet: its first head decides (`first_head`)
        self.spawn: Spawn | None = None
        self.finish: Callable[[Conn], None] | None = None  # its end, without a coroutine
        self.searched = 0
        # a request waiting for its client's turn (`park`): its head and bytes
        self.parked: Waiter | None = None
        self._parked: tuple[wire.RequestHead, bytes] | None = None

    def data_received(self, data: bytes) -> None:
        """A kept-alive request's bytes are served from here when they can be (the module
        docstring): a complete bodiless head, nothing after it, of an identified client;
        its client's turn first (at its fair share it waits for one here, from callbacks,
        in the same queue as the coroutine path's waits: docs/proxy.md#fair-share). Else,
        and after any fall-back, untouched: the coroutine path's (as `Side`'s)."""
        if self.fast is None:
            conn, steps = self.conn, self.steps
            if (
                conn is not None
                and conn.phase == "idle"
                and self.sink is None
                and not self.buf
                and self._waiter is not None
                and steps is not None
                and steps.fast_path
                and conn.owner is not None  # (the per-client count is the coroutine path's)
            ):
                limits = steps.limits
                try:
                    try:
                        parsed = wire.parse_request_head(
                            data, max_size=limits.max_head, max_headers=limits.max_headers
                        )
                    except ProtocolError:
                        parsed = None  # the coroutine path answers it
                    if parsed is not None:
                        head, used = parsed
                        if (
                            used == len(data)
                            and head.framing.kind == "none"
                            and head.method != "CONNECT"
                        ):
                            ticket = steps.turns.try_take(conn.owner)
                            if ticket is None:
                                self.park(steps, conn, head, data)
                                return
                            if begin(self, head, data, ticket):
                                return
                except Exception:  # a bug here must not lose the request: the coroutine path
                    log.exception("egress: fast path failed for %s", conn.client)
        super().data_received(data)

    # the kept decision holds its client's policy: never past the connection, nor past the
    # moment the proxy closes it (a released sandbox's listener, a revocation)
    def connection_lost(self, exc: Exception | None) -> None:
        self.kept = None
        super().connection_lost(exc)

    def close(self) -> None:
        self.kept = None
        super().close()

    def abort(self) -> None:
        self.kept = None
        super().abort()

    def _wake(self) -> None:
        if self.fast is not None:  # held back while an exchange is in flight (module docstring)
            return
        parked = self.parked
        if parked is not None:  # held back while its request waits for a turn (`park`)
            if not self.lost:
                return
            parked.cancel()  # gone meanwhile: the coroutine ends it, as it would have
            self.parked = self._parked = None
        if self.spawn is not None:
            self.first_head()
            return
        super()._wake()

    def wake(self) -> None:
        super()._wake()

    def park(self, steps: Steps, conn: Conn, head: wire.RequestHead, data: bytes) -> None:
        """Hold a kept-alive request until its client has a turn (its fair share is in
        flight): then served from callbacks (`_turn`), with no coroutine step for the wait;
        its bytes wait in `buf`, where the coroutine would find them if it must serve it."""
        self.buf += data
        self._parked = (head, data)
        self.parked = steps.turns.wait(conn.owner, self._turn)

    def _turn(self, ticket: Ticket) -> None:
        self.parked = None
        parked, self._parked = self._parked, None
        conn, steps = self.conn, self.steps
        assert conn is not None
        assert steps is not None
        assert parked is not None
        head, data = parked
        served = False
        if not self.lost and conn.end is None and not steps.closing:
            self.consume(len(data))  # bytes after it (a next request) stay
            try:
                served = begin(self, head, data, ticket)
            except Exception:  # a bug here must not lose the request: the coroutine path
                log.exception("egress: fast path failed for %s", conn.client)
            if not served:
                self.buf[:0] = data
        if not served:
            steps.turns.give_back(ticket)  # (a no-op if `begin` gave it back)
            self.wake()

    def first_head(self) -> None:
        """Bytes, EOF or loss before any coroutine serves this connection: a complete CONNECT
        head is served here (`Carrier`), anything else by the coroutine path, which parses
        the buffered bytes again (a refusal, a request, an end: as it always did)."""
        conn, steps, spawn = self.conn, self.steps, self.spawn
        assert conn is not None
        assert steps is not None
        assert spawn is not None
        parsed = None
        if self.buf and not self.eof:
            limits = steps.limits
            try:
                parsed = wire.parse_request_head(
                    self.buf,
                    max_size=limits.max_head,
                    max_headers=limits.max_headers,
                    searched=self.searched,
                )
            except ProtocolError:
                parsed = None
            else:
                if parsed is None and self.buf[:1] != b"\x16":  # (a TLS record: answered there)
                    self.searched = len(self.buf)
                    return  # the rest of the head is still to come
        self.spawn = None
        if parsed is None or parsed[0].method != "CONNECT":
            spawn(conn, None)
            return
        head, used = parsed
        conn.serving(bytes(self.buf[:used]))
        self.consume(used)
        carrier = Carrier(steps, conn, self, spawn)
        carrier.begin(head)

    def finished(self) -> None:
        conn, finish = self.conn, self.finish
        if conn is not None and finish is not None:
            finish(conn)


class Carrier:
    """The callback driver: supplies the waiting for one exchange from loop callbacks, the
    twin of `coroutine.drive` (the same executor, so the same answers and records) for a
    tunnel's whole set-up: decide, dial (`Dialer`, no task), `200`, the SNI check, relay.
    What must wait on something other than a socket (a name not in the resolver's cache)
    is handed to the coroutine driver mid-exchange (docs/architecture.md#the-callback-driver).
    """

    __slots__ = ("conn", "ex", "futures", "gone", "over", "side", "spawn", "steps", "timer")

    def __init__(self, steps: Steps, conn: Conn, side: FastClient, spawn: Spawn) -> None:
        self.steps = steps
        self.conn = conn
        self.side = side
        self.spawn = spawn
        self.ex: Executor | None = None
        self.over = False  # the relay ended (or one direction failed)
        self.gone: str | None = None
        self.futures: tuple[asyncio.Future[None], asyncio.Future[None]] | None = None
        self.timer: asyncio.TimerHandle | None = None

    def begin(self, head: wire.RequestHead) -> None:
        self.conn.exchange_begins()
        self._carry(self._start, head)

    def _start(self, head: wire.RequestHead) -> Action:
        x, action = connect_exchange(self.steps, self.conn, head)
        ex = self.ex = Executor(self.steps, self.conn, x)
        ex.woken = self._dialed
        return action

    def _carry(self, resume: Callable[..., Action | Wait], *args: object) -> None:
        """This driver's one guard around the exchange (its start, a dial's report, more of
        a ClientHello): `resume` gives the next step, carried on until it waits."""
        try:
            self._run(resume(*args))
        except Exception:
            self._failed()

    def _failed(self) -> None:
        """A bug must never take the proxy down (as `Intake._serve`): logged, closed."""
        conn = self.conn
        log.exception("egress: unexpected error serving %s", conn.client)
        self.side.on_wake = None
        conn.side.abort()
        if conn.upstream is not None:
            conn.upstream.abort()
        self.side.finished()

    def _run(self, step: Action | Wait) -> None:
        """Carry the exchange on until it waits: a dial's report (`_dialed`) or more of a
        ClientHello (`_hello_more`) resume it here; a lookup is the coroutine's."""
        ex = self.ex
        assert ex is not None
        while step.__class__ is not Wait:
            step = ex.carry_out(step)  # type: ignore[arg-type]
        if step is DIAL:
            return  # `_dialed` carries it on (at once, if the dial reported as it started)
        if step is HELLO:
            self.side.on_wake = self._hello_more
        elif step is RELAY:
            self._relay()
        elif step is LOOKUP:  # a lookup: the coroutine driver carries on from here
            assert ex.lookup is not None
            self.spawn(self.conn, carry_on(self.steps, self.conn, ex.x, ex.lookup))
        else:
            assert step is END, step
            self.side.finished()

    # --- what resumes it ----------------------------------------------------------------------
    def _dialed(self) -> None:
        """The executor's dial reported (from a loop callback, or as it started)."""
        ex = self.ex
        assert ex is not None
        self._carry(ex.dialed, ex.outcome)

    def _hello_more(self) -> None:
        """More of the ClientHello, or the client's end."""
        ex = self.ex
        assert ex is not None
        self.side.on_wake = None  # (set again if more is still to come)
        self._carry(ex.hello_more)

    # --- relay (as `tunnel.relay_tunnel`) ------------------------------------------------------
    def _relay(self) -> None:
        ex = self.ex
        assert ex is not None
        up, down = self.futures = open_relay(self.steps, self.conn, ex.x)
        up.add_done_callback(self._relay_moved)
        down.add_done_callback(self._relay_moved)

    def _relay_moved(self, _: object) -> None:
        futures = self.futures
        if futures is None:
            return  # ended already
        up, down = futures
        try:
            if not self.over:
                if not relay_over(up, down):
                    return
                self.over = True
                self.gone = who_left(self.conn)
                if not (up.done() and down.done()):
                    cut(self.conn)
                    self.timer = self.steps.loop.call_later(1.0, self._relay_ended)
                    return
            elif not (up.done() and down.done()):
                return
            self._relay_ended()
        except Exception:
            self._failed()

    def _relay_ended(self) -> None:
        futures, ex = self.futures, self.ex
        if futures is None or ex is None:
            return
        self.futures = None
        if self.timer is not None:
            self.timer.cancel()
        end_relay(self.steps, self.conn, ex.x, futures, self.gone)
        self.side.finished()


__all__ = ["Carrier", "FastClient", "Spawn"]

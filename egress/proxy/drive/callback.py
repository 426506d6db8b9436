"""The synchronous driver: exchanges carried out from protocol callbacks, without a task.

Two kinds: a kept-alive absolute-form request (the callback fast path, below), and a
CONNECT's whole tunnel set-up when it is a connection's first head (`Carrier`: accept
without a task, decide, dial, `200`, SNI, relay; docs/architecture.md#the-callback-driver).

Shell. Why: on a kept-alive connection, the coroutine path (`modes/http/serve.py`) costs two
waits per request (client bytes -> the connection's task; upstream bytes -> the task), each a
future, a task step and several coroutine frames, about ten times the cost of the same hand-over as
a plain callback (bench/profile.md). Here the client's `data_received` parses the head and
drives the same `Exchange` synchronously (the gate's cached verdicts, a name only from the
resolver's cache), writes it to an idle pooled upstream already dialed for that checked
address, and the upstream's callback (`Side.on_wake`) parses the response head and relays
it with the functions the coroutine path uses (`modes.http.serve.response_out`,
`finish_exchange`: the same audit record and metrics,
docs/architecture.md#the-callback-fast-path).

Only what needs no waiting before the upstream write is taken: a complete bodiless head and
nothing after it, an absolute `http://` target whose head can be forwarded,
an identified client, an admitted verdict (an IP literal, or a name in the resolver's
cache), an idle pooled upstream. Anything else - the first request of a connection, a
refusal, a body, a dial, DNS, a malformed head - is left untouched to the connection's
coroutine, which parses it again and serves it as before. After the upstream write, every
outcome is handled here exactly as `modes.http.serve.serve_request` would (1xx relayed, 101
and malformed responses refused with an audit record, response bodies relayed by `Side`'s
relay mode with flow control).

The connection's coroutine stays parked in `read_head` while the fast path runs; the
client side holds back its wake-up (bytes of a next request, EOF) until the exchange ends,
so the two paths never run at once on one connection.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Final

from ...errors import ProtocolError, TargetError
from ...policy.target import Target, split_url
from ...reasons import End
from ..codec import http1 as wire
from ..core.actions import Action, Refuse
from ..core.exchange import Exchange, State
from ..core.gate import Refuse as Verdict
from ..core.kept import ANY_CREDENTIAL, Kept
from ..core.reader import FINAL, INTERIM, UNANSWERED, ResponseReader
from ..core.record import perf_counter_ns, seconds_since
from ..fairshare import Ticket, Waiter
from ..modes.connect.serve import connect_exchange
from ..modes.http.serve import (
    answer,
    cut_by_proxy,
    finish_exchange,
    framer_for,
    request_intent,
    request_out,
    response_end,
)
from ..net.dialer import Dialer
from ..net.relay import RelayEnded, Side
from .executor import DIAL, END, HELLO, LOOKUP, RELAY, Executor, Wait
from .tunnel import carry_on, cut, end_relay, open_relay, relay_over, who_left

if TYPE_CHECKING:
    from ...policy.target import IPAddress
    from ..net.conn import Conn
    from ..runtime import Steps

log = logging.getLogger("egress")
DONE: Final = State.DONE


class FastExchange:
    """One request in flight on the fast path (see the module docstring)."""

    __slots__ = ("conn", "end", "head", "out", "reader", "steps", "ticket", "upstream", "x")

    def __init__(
        self, steps: Steps, conn: Conn, head: wire.RequestHead, x: Exchange, upstream: Side
    ) -> None:
        self.steps = steps
        self.conn = conn
        self.head = head
        self.x = x
        self.upstream = upstream
        self.end: str | None = None  # how its response body was cut short, if it was
        self.ticket: Ticket | None = None  # its client's request slot, given back at the end
        self.out = b""  # the head sent upstream (sent again by a retry, `_retry`)
        # what the upstream answers, read and decided as on the coroutine path
        self.reader = ResponseReader(x, head, steps.closing)

    # --- the upstream's callbacks ------------------------------------------------------------
    def on_upstream(self) -> None:
        """Bytes, EOF or loss on the upstream while its response head is awaited: fed to the
        response reader (`core/reader.py`), which decides what they mean."""
        up, reader = self.upstream, self.reader
        try:
            while True:
                got = reader.read(up.buf, up.eof)
                if got is None:
                    return  # more to come
                if got is INTERIM:  # relayed, and read on
                    up.consume(reader.used)
                    self.conn.side.write(reader.raw)
                    continue
                if got is FINAL:
                    up.consume(reader.used)
                    up.on_wake = None
                    self._relay(reader)
                elif got is not UNANSWERED or not self._retry():
                    self._refused(got)
                return
        except Exception:  # a bug must never take the proxy down (as server._serve)
            log.exception("egress: unexpected error serving %s", self.conn.client)
            self.upstream.on_wake = None
            self.upstream.abort()
            self.conn.side.abort()
            self._done(False)

    def _retry(self) -> bool:
        """Send the request again on a fresh upstream to the checked address, as
        `modes.http.serve` does (`Exchange.retry`: idempotent, once); False if it may not."""
        if cut_by_proxy(self.conn):
            return False
        again = self.x.retry(True)  # (the fast path takes bodiless requests only)
        if again is None:
            return False
        self.upstream.on_wake = None
        self.upstream.close()
        steps = self.steps
        dialer = Dialer(steps.loop, again.addrs, again.port, self._redialed, steps.metrics)
        self.conn.dial_started(dialer)
        dialer.start()
        return True

    def _redialed(self, outcome: tuple[Side, IPAddress] | Verdict) -> None:
        self.conn.dial_over()
        if isinstance(outcome, Verdict) or cut_by_proxy(self.conn):
            if not isinstance(outcome, Verdict):  # cut while it dialed: nothing is sent
                outcome[0].close()
                outcome = UNANSWERED
            self._refused(outcome)  # answered (or cut) and recorded, `retried: 1`
            return
        self.upstream = up = outcome[0]
        self.conn.connected(up, self.x.record)
        up.on_wake = self.on_upstream
        up.write(self.out)

    def _relay(self, reader: ResponseReader) -> None:
        """As `modes.http.serve`'s `_relay_response`, with the relay's end as a callback."""
        resp, out = reader.head, reader.out
        assert resp is not None
        client = self.conn.side
        kind = resp.framing.kind
        up = self.upstream
        if kind == "length" and 0 < resp.framing.length <= len(up.buf):
            # the whole body is already here: head and body in one write, as `start_relay`
            # would send them, without its future (bytes past the body stay in `buf`, and
            # the pool then closes the upstream)
            n = resp.framing.length
            if client.write(out + bytes(up.buf[:n])):
                up.bytes_relayed += n
                up.consume(n)
                self._end(True)
            else:
                up.consume(n)
                self.end = End.CLIENT_CLOSED.value  # the client is gone (docs/audit-log.md)
                self._end(False)
            return
        framer = framer_for(resp.framing, 502) if kind in ("length", "chunked") else None
        if kind == "none" or (kind != "close" and framer is None):
            if not client.write(out):
                self.end = End.CLIENT_CLOSED.value
            self._end(self.end is None)
            return
        if kind == "close":
            client.write(out)
        fut = self.upstream.start_relay(client, framer, prefix=b"" if kind == "close" else out)
        if fut.done():  # the whole body was already buffered: no trip through the loop
            self._relayed(fut)
        else:
            fut.add_done_callback(self._relayed)

    def _relayed(self, fut: asyncio.Future[None]) -> None:
        exc = None if fut.cancelled() else fut.exception()
        ok = True
        resp = self.reader.head
        if isinstance(exc, RelayEnded) and resp is not None:
            # until-close: its end is the close, unless the client went away
            if resp.framing.kind != "close" or exc.sink:
                self.end = response_end(exc)
                ok = False
        elif fut.cancelled() or exc is not None:
            ok = False
        self._end(ok)

    # --- the exchange's end: as modes.http.serve.serve_request's ----------------------------
    def _end(self, ok: bool) -> None:
        steps, reader = self.steps, self.reader
        self._done(
            finish_exchange(steps, self.conn, self.upstream, reader, self.x, ok=ok, end=self.end)
        )

    def _refused(self, refusal: Verdict | Refuse) -> None:
        self.upstream.on_wake = None
        self.upstream.close()
        conn = self.conn
        if cut_by_proxy(conn) and isinstance(refusal, Verdict):
            # cut by the proxy (a policy change, a stop): nothing to answer, its record says so
            finish_exchange(self.steps, conn, self.upstream, None, self.x, ok=False, end=None)
            self._done(False)
            return
        self._done(answer(self.steps, conn, self.head, self.x, refusal))

    def _done(self, keep: bool) -> None:
        """Hand the connection back to its coroutine: idle, or closing."""
        if self.ticket is not None:
            self.steps.turns.give_back(self.ticket)
        conn = self.conn
        conn.request_ended(self.steps.loop.time())
        side = conn.side
        assert isinstance(side, FastClient)
        side.fast = None
        if not keep:
            side.buf.clear()  # no further request on this connection
            side.close()
        if side.buf or side.eof:
            side.wake()


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
                            if begin(steps, conn, head, data, ticket):
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
                served = begin(steps, conn, head, data, ticket)
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
        """A bug must never take the proxy down (as `server._serve`): logged, closed."""
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


def begin(steps: Steps, conn: Conn, head: wire.RequestHead, data: bytes, ticket: Ticket) -> bool:
    """A kept-alive request served from callbacks (`FastClient.data_received`), its client's
    turn taken: False (the turn given back, nothing done) if it must take the coroutine
    path. The exchange is carried out by its executor up
    to its relay on an idle pooled upstream; it may not dial and leaves the metrics to the
    end, so a request handed over (a lookup, a dial, a refusal: the coroutine path decides
    again and answers it) is observed once. When the connection's last decision holds for
    it (`core/kept.py`), the exchange starts from that decision instead of the gate's."""
    t0 = perf_counter_ns()
    side = conn.side
    assert isinstance(side, FastClient)
    kept = side.kept
    path: str | None = None
    if kept is not None:
        path = kept_path(steps, conn, head, kept)
        if path is not None:
            steps.kept_hits += 1
            x = Exchange(steps.gate, kept.front)
            target, explicit_port = kept.target, kept.explicit_port
            step: Action | Wait = x.start_kept(
                conn.client, head.method, path, t0, conn.orig_dst, kept
            )
        else:
            kept = side.kept = None
    if kept is None:
        intent = request_intent(steps, conn, head, t0)
        found = intent.target
        if intent.then is not None or not isinstance(found, Target) or intent.path is None:
            steps.turns.give_back(ticket)
            return False
        target, path, explicit_port = found, intent.path, intent.explicit_port
        x = Exchange(steps.gate, conn.listener.mode.request_front)
        step = x.start(intent)
    assert path is not None
    try:
        out = request_out(head, data, target, path, explicit_port)
    except (ValueError, UnicodeEncodeError):
        steps.turns.give_back(ticket)
        return False  # the coroutine path answers it (400)
    ex = side.executor
    if ex is None:  # one per connection, for its kept-alive requests
        ex = side.executor = Executor(steps, conn, x, dials=False, timed=False)
    ex.x, ex.cache_hit = x, kept is not None and kept.resolved is not None
    try:
        while step is not RELAY:
            if x.state is DONE or step.__class__ is Wait:  # refused, a lookup, a dial
                steps.turns.give_back(ticket)
                return False
            step = ex.carry_out(step)  # type: ignore[arg-type]
    finally:
        # the exchange is the FastExchange's or the coroutine's now: the connection's
        # executor must not keep it (and with it a released sandbox's policy) alive
        del ex.x
    # from here on the request is ours: nothing below falls back
    if kept is None:
        side.kept = keep_decision(steps, conn, head, x, explicit_port)
    metrics = steps.metrics
    if metrics is not None:  # docs/metrics.md
        if ex.cache_hit:  # a resolver cache hit: answered without a wait
            metrics.dns.observe(0.0)
        metrics.decision.observe(seconds_since(t0))
    upstream = conn.upstream
    assert upstream is not None
    conn.request_forwarded(data, x.record)  # (no earlier change is its: `request_ended`)
    side.last_active = steps.loop.time()
    fx = FastExchange(steps, conn, head, x, upstream)
    fx.ticket = ticket
    fx.out = out
    side.fast = fx
    upstream.on_wake = fx.on_upstream
    upstream.write(out)
    return True


def kept_path(steps: Steps, conn: Conn, head: wire.RequestHead, kept: Kept) -> str | None:
    """The request's path when the connection's last decision holds for it (the key of
    `core/kept.py`: the same authority, client, policy, guard, credential and, for a name,
    the resolver's same answer), and the audit log takes records; else None: judged afresh."""
    raw = head.target
    if raw[:7].lower() != "http://":
        return None
    try:
        _, authority, path = split_url(raw)
    except TargetError:
        return None
    gate = steps.gate
    if not kept.holds(authority, conn.listener.identity, gate.clients, gate.guard, conn.owner):
        return None
    credential = kept.credential
    if credential is not ANY_CREDENTIAL and head.get("proxy-authorization") != credential:
        return None
    resolved = kept.resolved
    if resolved is not None and steps.resolver.cached(kept.target.host) is not resolved:
        return None
    audit = steps.audit
    if audit is not None and not audit.accepting:
        return None  # closed mode: the full path refuses it (docs/audit-log.md)
    return path


def keep_decision(
    steps: Steps, conn: Conn, head: wire.RequestHead, x: Exchange, explicit_port: bool
) -> Kept | None:
    """The decision `x` reached, under what it depends on now (nothing has run since it was
    reached: this is the same callback), for the connection's next request."""
    raw = head.target
    try:
        _, authority, _ = split_url(raw)
    except TargetError:
        return None
    gate = steps.gate
    bound, clients = conn.listener.identity, gate.clients
    credential: object = ANY_CREDENTIAL
    if bound is None and not clients.trivial:
        credential = head.get("proxy-authorization")
    target = x.record.host
    resolved = None if x.dialed_addr is None else steps.resolver.cached(target)
    return x.kept(
        authority=authority,
        bound=bound,
        clients=clients,
        credential=credential,
        guard=gate.guard,
        owner=conn.owner,
        resolved=resolved,
        explicit_port=explicit_port,
    )


__all__ = ["Carrier", "FastClient", "FastExchange", "Spawn", "begin", "keep_decision", "kept_path"]

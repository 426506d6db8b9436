"""The callback fast path: a kept-alive request served from protocol callbacks, no task.

Shell. Why: on a kept-alive connection, the coroutine path (`modes/http.py`) costs two
waits per request (client bytes -> the connection's task; upstream bytes -> the task), each a
future, a task step and several coroutine frames, about ten times the cost of the same hand-over as
a plain callback (bench/profile.md). Here the client's `data_received` (`callback.FastClient`)
parses the head and `begin` drives the same `Exchange` synchronously (the gate's cached
verdicts, a name only from the resolver's cache, or the connection's kept decision), writes
it to an idle pooled upstream already dialed for that checked address, and the upstream's
callback (`Side.on_wake`) feeds its bytes to the response reader both drivers use
(`core/reader.py`) and ends the exchange with the coroutine path's `finish_exchange`: the
same audit record and metrics (docs/architecture.md#the-callback-fast-path).

Only what needs no waiting before the upstream write is taken: a complete bodiless head and
nothing after it, an absolute `http://` target whose head can be forwarded,
an identified client, an admitted verdict (an IP literal, or a name in the resolver's
cache), an idle pooled upstream. Anything else - the first request of a connection, a
refusal, a body, a dial, DNS, a malformed head - is left untouched to the connection's
coroutine, which parses it again and serves it as before. After the upstream write, every
outcome is handled here exactly as `modes.http.serve_request` would (1xx relayed, 101
and malformed responses refused with an audit record, response bodies relayed by `Side`'s
relay mode with flow control).

The connection's coroutine stays parked in `read_head` while the fast path runs; the
client side holds back its wake-up (bytes of a next request, EOF) until the exchange ends,
so the two paths never run at once on one connection.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Final, Protocol

from ...errors import TargetError
from ...policy.target import Target, split_url
from ...reasons import End
from ..codec import http1 as wire
from ..core.actions import Refuse
from ..core.exchange import Exchange, State
from ..core.gate import Verdict
from ..core.kept import ANY_CREDENTIAL, Kept
from ..core.reader import FINAL, INTERIM, UNANSWERED, ResponseReader
from ..core.record import perf_counter_ns
from ..fairshare import Ticket
from ..modes.http import (
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
from .executor import RELAY, Executor, Wait

if TYPE_CHECKING:
    from ...policy.target import IPAddress
    from ..core.actions import Action
    from ..net.conn import Conn
    from ..runtime import Steps

log = logging.getLogger("egress")
DONE: Final = State.DONE


class KeptAlive(Protocol):
    """The client side a kept-alive request is served on (`callback.FastClient`): what the
    fast path reads and sets of it."""

    buf: bytearray
    eof: bool
    last_active: float
    fast: FastExchange | None  # the request in flight (its wake-ups held back meanwhile)
    kept: Kept | None  # its last request's decision (`core/kept.py`)
    executor: Executor | None  # its kept-alive requests' (one per connection)
    conn: Conn | None
    steps: Steps | None

    def close(self) -> None: ...

    def wake(self) -> None: ...


class FastExchange:
    """One request in flight on the fast path (see the module docstring)."""

    __slots__ = (
        "client",
        "conn",
        "end",
        "head",
        "out",
        "reader",
        "steps",
        "ticket",
        "upstream",
        "x",
    )

    def __init__(
        self,
        steps: Steps,
        conn: Conn,
        client: KeptAlive,
        head: wire.RequestHead,
        x: Exchange,
        upstream: Side,
    ) -> None:
        self.steps = steps
        self.conn = conn
        self.client = client  # `conn.side`
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
        except Exception:  # a bug must never take the proxy down (as Intake._serve)
            log.exception("egress: unexpected error serving %s", self.conn.client)
            self.upstream.on_wake = None
            self.upstream.abort()
            self.conn.side.abort()
            self._done(False)

    def _retry(self) -> bool:
        """Send the request again on a fresh upstream to the checked address, as
        `modes.http` does (`Exchange.retry`: idempotent, once); False if it may not."""
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
        self.x.sent()

    def _relay(self, reader: ResponseReader) -> None:
        """As `modes.http`'s `_relay_response`, with the relay's end as a callback."""
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

    # --- the exchange's end: as modes.http.serve_request's ----------------------------------
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
        side = self.client
        side.fast = None
        if not keep:
            side.buf.clear()  # no further request on this connection
            side.close()
        if side.buf or side.eof:
            side.wake()


def begin(side: KeptAlive, head: wire.RequestHead, data: bytes, ticket: Ticket) -> bool:
    """A kept-alive request served from callbacks (`FastClient.data_received`), its client's
    turn taken: False (the turn given back, nothing done) if it must take the coroutine
    path. The exchange is carried out by its executor up
    to its relay on an idle pooled upstream; it may not dial and leaves the metrics to the
    end, so a request handed over (a lookup, a dial, a refusal: the coroutine path decides
    again and answers it) is observed once. When the connection's last decision holds for
    it (`core/kept.py`), the exchange starts from that decision instead of the gate's."""
    t0 = perf_counter_ns()
    steps, conn = side.steps, side.conn
    assert steps is not None
    assert conn is not None
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
        # (`seconds_since`, inline: a call fewer per kept-alive request)
        metrics.decision.observe((perf_counter_ns() - t0) / 1e9)
    upstream = conn.upstream
    assert upstream is not None
    conn.request_forwarded(data, x.record)  # (no earlier change is its: `request_ended`)
    side.last_active = steps.loop.time()
    fx = FastExchange(steps, conn, side, head, x, upstream)
    fx.ticket = ticket
    fx.out = out
    side.fast = fx
    upstream.on_wake = fx.on_upstream
    upstream.write(out)
    x.sent()
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
    return Kept.reached(
        x,
        authority=authority,
        bound=bound,
        clients=clients,
        credential=credential,
        guard=gate.guard,
        owner=conn.owner,
        resolved=resolved,
        explicit_port=explicit_port,
    )


__all__ = ["FastExchange", "KeptAlive", "begin", "keep_decision", "kept_path"]

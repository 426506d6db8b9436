"""Absolute-form HTTP/1 forwarding: one request out, one response back, on pooled upstreams.

Shell. `serve_request` carries out what the gate decided for an absolute-form request:
forward the head (hop-by-hop fields removed, `Host` set; byte-identical when nothing needs
rewriting, docs/wire.md), relay the body with its framer, feed the upstream's bytes to the
response reader (`core/reader.py`: 1xx relayed, 101 refused, keep-alive and pooling decided
there, once for both drivers), relay the response body, and hand the upstream back to the
pool when the reader says it may go. Its answers are `kinds.HTTP`'s, one status per
`Reason`; a refusal's bytes are `core/responses.render_refusal`'s (docs/proxy.md#error-responses).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...errors import TargetError
from ...policy.target import IPAddress, Target, host_header, make_target
from ...reasons import End
from ..codec import http1 as wire
from ..codec import rewrite
from ..codec.chunked import ChunkedScanner
from ..core.actions import Refuse
from ..core.exchange import Exchange
from ..core.gate import Verdict, keep_alive_after, refuse_request
from ..core.intent import Intent
from ..core.reader import FINAL, INTERIM, UNANSWERED, Read, ResponseReader
from ..core.record import perf_counter_ns
from ..drive.coroutine import drive, refuse
from ..fairshare import Ticket
from ..net.dialer import Dialer
from ..net.relay import Framer, LengthFramer, RelayEnded, Side

if TYPE_CHECKING:
    from ..net.conn import Conn
    from ..runtime import Steps


@dataclass(frozen=True, slots=True)
class _Request:
    """An absolute-form request being forwarded: the head and what was judged and dialed."""

    head: wire.RequestHead
    target: Target
    path: str
    explicit_port: bool


def request_intent(steps: Steps, conn: Conn, head: wire.RequestHead, t0: int) -> Intent:
    """The front-end of an absolute-form request: the gate's target, then who is asking
    (counted against the client's cap). A `ws://` target names a destination the policy
    judges first (docs/proxy.md#websocket): its intent refuses after the name's verdict."""
    gate = steps.gate
    parsed = gate.request_target(head.target)
    audit = steps.audit
    audit_ok = audit is None or audit.accepting
    if isinstance(parsed, Verdict):
        ws = _websocket_target(head, parsed)
        if not isinstance(ws, Target):  # not ws://, or not a destination: the 400 alone
            # no destination: its record names the client and the listener instead, as a
            # connection record does (docs/audit-log.md#connection-records)
            who = gate.identify(conn.listener.identity, conn.peer, head)
            named = conn.listener.named
            return Intent(conn.client, head.method, "http", "", 0, t0, parsed, who, listener=named)
        target, path, explicit, then = ws, None, False, parsed
        audit_ok = True  # answered 400 or the policy's refusal, as before any dial
    else:
        target, path, explicit = parsed
        then = None
    identity = gate.identify(conn.listener.identity, conn.peer, head)
    cap = steps.cap(conn, identity)
    return Intent(
        conn.client,
        head.method,
        "http",
        "",
        0,
        t0,
        target,
        identity,
        cap,
        path=path,
        explicit_port=explicit,
        orig_dst=conn.orig_dst,
        audit_ok=audit_ok,
        then=then,
    )


def _websocket_target(head: wire.RequestHead, refusal: Verdict) -> Target | None:
    """A `ws://`/`wss://` request's destination (None: not one, or not a valid
    destination: answered with the refusal's 400 alone)."""
    if refusal.where is None:
        return None
    host, port = refusal.where
    secure = head.target[:6].lower() == "wss://"
    try:
        return make_target("https" if secure else "http", host, port)
    except TargetError:
        return None


async def serve_request(steps: Steps, conn: Conn, head: wire.RequestHead) -> bool:
    """One absolute-form request; True if the client connection may serve another."""
    x = Exchange(steps.gate, conn.listener.mode.request_front)
    intent = request_intent(steps, conn, head, perf_counter_ns())
    turn: Ticket | None = None  # this request's slot of its client (fairshare.py)

    async def take_turn() -> None:
        """A fair share: at most N of this client's at once (after DNS: a slow name holds
        none; docs/proxy.md#fair-share)."""
        nonlocal turn
        if conn.owner is not None:
            turn = steps.turns.try_take(conn.owner)
            if turn is None:
                turn = await steps.turns.take(conn.owner)

    # until it is dialed, the previous exchange is not what is open (nor, for a recheck,
    # what a change found being dialed then: drive.coroutine.revoked_meanwhile)
    conn.exchange_begins()
    try:
        keep = _keeper(steps, head)
        relay = await drive(steps, conn, x, x.start(intent), keep=keep, before_pooled=take_turn)
        if relay is None:
            return _kept(steps, head, x.refusal)
        upstream = conn.upstream
        assert upstream is not None
        # re-judged if its client's policy changes, in flight and once kept alive after it
        # (docs/policy.md#live-policy-changes)
        conn.relays(x.record)
        assert isinstance(intent.target, Target)
        request = _Request(head, intent.target, intent.path or "/", intent.explicit_port)
        return await _exchange(steps, conn, request, upstream, x)
    finally:
        conn.upstream_done()
        if turn is not None:
            steps.turns.give_back(turn)


def _kept(steps: Steps, head: wire.RequestHead, verdict: Verdict | None) -> bool:
    """After a refusal: may the client connection go on (`gate.keep_alive_after`)?"""
    return verdict is not None and keep_alive_after(
        verdict,
        bodiless=head.framing.kind == "none",
        keep_alive=head.keep_alive,
        closing=steps.closing,
    )


def _keeper(steps: Steps, head: wire.RequestHead) -> Callable[[Verdict], bool]:
    return lambda verdict: _kept(steps, head, verdict)


def answer(
    steps: Steps, conn: Conn, head: wire.RequestHead, x: Exchange, refused: Verdict | Refuse
) -> bool:
    """Answer a refusal of an exchange under way (a broken body, an upstream that answered
    nonsense or a 101): answered and recorded by the exchange; True if the client
    connection may go on."""
    action = refused if isinstance(refused, Refuse) else x.refuse(refused)
    keep = _kept(steps, head, action.verdict)
    refuse(steps, conn, action, close=not keep)
    return keep


async def _exchange(steps: Steps, conn: Conn, req: _Request, upstream: Side, x: Exchange) -> bool:
    """Send the request, relay the response; True if the client connection may go on."""
    head = req.head
    try:
        out = request_out(head, conn.raw_head, req.target, req.path, req.explicit_port)
    except (ValueError, UnicodeEncodeError) as exc:
        upstream.close()
        return answer(steps, conn, head, x, refuse_request(f"cannot forward request: {exc}"))
    upstream.write(out)
    x.sent()
    body = framer_for(head.framing, 400)
    req_done = conn.side.start_relay(upstream, body) if body is not None else None
    if req_done is not None:
        # a malformed or truncated request body ends the exchange at once
        req_done.add_done_callback(lambda f: _abort_on_error(f, upstream))
    reader = ResponseReader(x, head, steps.closing)
    got = await _read_response(conn, upstream, reader)
    if got is UNANSWERED and req_done is None and upstream.last_rec is not None:
        # a pooled upstream that closed before answering: once more on a fresh one
        fresh = await _redial(steps, conn, x, req.head)
        if fresh is not None:
            upstream.close()
            if isinstance(fresh, Verdict):
                return answer(steps, conn, head, x, fresh)
            upstream = fresh
            conn.connected(upstream, x.record)
            upstream.write(out)
            x.sent()
            got = await _read_response(conn, upstream, reader)
    if got is not FINAL:
        upstream.close()
        if cut_by_proxy(conn) and isinstance(got, Verdict):
            # cut by the proxy (a policy change, shutdown, its sandbox released, idle):
            # nothing to answer, the exchange's record says so with `conn.end`
            if req_done is not None:
                _settle(req_done)
            return finish_exchange(steps, conn, upstream, None, x, ok=False, end=None)
        if req_done is not None and _client_went_away(req_done, conn.side):
            # the client closed inside its body: what reached the upstream was allowed and
            # sent, so the record is the allowed exchange, ended `client_closed`, with its
            # rule and bytes (not a 400 nobody reads; docs/audit-log.md#end-values)
            return finish_exchange(
                steps, conn, upstream, None, x, ok=False, end=End.CLIENT_CLOSED.value
            )
        body_error = _body_error(req_done) if req_done is not None else None
        assert not isinstance(got, Read)
        return answer(steps, conn, head, x, body_error or got)
    ok, end = await _relay_response(conn, reader, upstream)
    if req_done is not None:
        if not req_done.done():
            conn.side.close()  # the upstream answered before the body ended: stop both
        ok = _settle(req_done) and ok
    return finish_exchange(steps, conn, upstream, reader, x, ok=ok, end=end)


async def _redial(
    steps: Steps, conn: Conn, x: Exchange, head: wire.RequestHead
) -> Side | Verdict | None:
    """A fresh upstream to the address already checked, for a request its pooled one left
    unanswered (`Exchange.retry`: idempotent and bodiless, once); None when it may not be
    sent again, or the proxy cut it (before or while it dialed); the dial's refusal if none
    answered."""
    if cut_by_proxy(conn):
        return None
    framing = head.framing
    dial_again = x.retry(
        framing.kind == "none" or (framing.kind == "length" and not framing.length)
    )
    if dial_again is None:
        return None
    found: asyncio.Future[tuple[Side, IPAddress] | Verdict] = steps.loop.create_future()

    def done(outcome: tuple[Side, IPAddress] | Verdict) -> None:
        if not found.done():
            found.set_result(outcome)
        elif isinstance(outcome, tuple):  # this task was cancelled meanwhile: nobody's
            outcome[0].close()

    # the `Dialer` both drivers use: the sweeper times it out, a stop gives it up
    dialer = Dialer(steps.loop, dial_again.addrs, dial_again.port, done, steps.metrics)
    conn.dial_started(dialer)
    try:
        dialer.start()
        got = await found
    finally:
        conn.dial_over()
        dialer.cancel()  # (a no-op once it reported)
    if isinstance(got, Verdict):
        return got
    if cut_by_proxy(conn):  # a policy change or a stop while it dialed: nothing is sent
        got[0].close()
        return None
    return got[0]


def request_out(
    head: wire.RequestHead, raw: bytes, target: Target, path: str, explicit_port: bool
) -> bytes:
    """The head to send upstream (hop-by-hop fields removed, `Host` set; the client's own
    bytes when nothing needs rewriting, docs/wire.md). Raises ValueError or
    UnicodeEncodeError when it cannot be serialized."""
    host = host_header(target, explicit_port)
    out = rewrite.passthrough_request_head(head, raw, path, host)
    if out is None:
        fields = rewrite.forward_headers(head, host)
        out = rewrite.serialize_request_head(head.method, path, fields, version=head.version)
    return out


def finish_exchange(
    steps: Steps,
    conn: Conn,
    upstream: Side,
    reader: ResponseReader | None,
    x: Exchange,
    *,
    ok: bool,
    end: str | None,
) -> bool:
    """End an exchange (its record) and pool (or close) its upstream as its response reader
    decided; True if the client connection may go on. `ok`: the response relayed cleanly;
    `reader` None: cut before a response (by the proxy). An exchange
    the proxy cut ends as `conn.end` says, whatever its relay saw of the cut: `revoked` by a
    policy change (docs/policy.md#live-policy-changes), `shutdown` at a stop, `released`,
    `idle_timeout` (docs/audit-log.md#end-values)."""
    if conn.end is not None:  # (None: every request)
        end, ok = conn.end, False
    up, down = conn.side.bytes_relayed, upstream.bytes_relayed
    conn.side.bytes_relayed = upstream.bytes_relayed = 0
    steps.done(x.ended(end, up, down))
    addr = x.dialed_addr
    if ok and reader is not None and reader.reuse and addr is not None:
        upstream.last_rec = x.record  # re-judged in the pool if a policy changes
        steps.pool.release(upstream, addr, x.record.port)
    else:
        upstream.close()
    return ok and reader is not None and reader.keep


async def _relay_response(
    conn: Conn, reader: ResponseReader, upstream: Side
) -> tuple[bool, str | None]:
    """Write the response head and relay its body (one write when it is all buffered):
    (clean, how it was cut short: `upstream_...`, or None)."""
    head_bytes = reader.out
    assert reader.head is not None
    framing = reader.head.framing
    kind = framing.kind
    framer = framer_for(framing, 502) if kind != "close" else None
    if kind != "close" and framer is None:  # no body, or Content-Length: 0
        if not conn.side.write(head_bytes):
            return False, End.CLIENT_CLOSED.value
        return True, None
    if kind == "close":
        if not conn.side.write(head_bytes):
            return False, End.CLIENT_CLOSED.value
        try:
            await upstream.start_relay(conn.side, None)
        except RelayEnded as exc:
            if exc.sink:  # the client went away: its end (until-close: the close is the end)
                return False, End.CLIENT_CLOSED.value
        return True, None
    try:
        await upstream.start_relay(conn.side, framer, prefix=head_bytes)
    except RelayEnded as exc:
        return False, response_end(exc)
    return True, None


def response_end(exc: RelayEnded) -> str:
    """How a response body relay cut short ended, named for the side that ended it: the
    client's reset or close (the relay could not write to it) is `client_closed`, else the
    upstream's `upstream_eof`/`upstream_lost`/`upstream_protocol`
    (docs/audit-log.md#end-values)."""
    return End.CLIENT_CLOSED.value if exc.sink else f"upstream_{exc.reason}"


def cut_by_proxy(conn: Conn) -> bool:
    """Whether the proxy cut this connection's exchange (a policy change, a stop, its
    sandbox released, a timeout): its record then ends as `conn.end` says, not as the
    failure the cut caused on either side (docs/audit-log.md#end-values)."""
    return conn.end is not None


async def _read_response(
    conn: Conn, upstream: Side, reader: ResponseReader
) -> Read | Refuse | Verdict:
    """Feed the upstream's bytes to the response reader until it has an answer: `FINAL`
    (its head consumed), or the refusal to answer with (`core/reader.py`); a 1xx is
    relayed to the client on the way."""
    while True:
        got = reader.read(upstream.buf, upstream.eof)
        if got is None:
            await upstream.read_more()
            continue
        if got is INTERIM or got is FINAL:
            upstream.consume(reader.used)
            if got is INTERIM:
                conn.side.write(reader.raw)
                continue
        return got


def framer_for(framing: wire.BodyFraming, status: int) -> Framer | None:
    if framing.kind == "length":
        return LengthFramer(framing.length) if framing.length else None
    if framing.kind == "chunked":
        return ChunkedScanner(error_status=status)
    return None


def _body_error(req_done: asyncio.Future[None]) -> Verdict | None:
    """If the request body relay failed, that is the answer (400), not the upstream's fate."""
    if not req_done.done() or _settle(req_done):
        if not req_done.done():
            _settle(req_done)
        return None
    exc = req_done.exception() if not req_done.cancelled() else None
    if isinstance(exc, RelayEnded) and exc.reason == "protocol":
        return refuse_request(f"malformed request body: {exc}")
    return refuse_request("client closed inside the request body")


def _client_went_away(req_done: asyncio.Future[None], client: Side) -> bool:
    """Whether the request body relay ended because the client closed (not a malformed
    body, which is a 400, nor an upstream that went away); marks its exception retrieved."""
    if not req_done.done() or req_done.cancelled():
        return False
    exc = req_done.exception()
    return (
        isinstance(exc, RelayEnded)
        and exc.reason in ("eof", "lost")
        and (client.eof or client.lost)
    )


def _abort_on_error(fut: asyncio.Future[None], upstream: Side) -> None:
    if fut.cancelled() or fut.exception() is not None:
        upstream.abort()


def _settle(fut: asyncio.Future[None]) -> bool:
    """True if a relay future ended cleanly; marks its exception retrieved either way."""
    if not fut.done():
        fut.cancel()
        return False
    if fut.cancelled():
        return False
    return fut.exception() is None


__all__ = [
    "answer",
    "cut_by_proxy",
    "finish_exchange",
    "framer_for",
    "request_out",
    "response_end",
    "serve_request",
]

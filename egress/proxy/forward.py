"""Absolute-form HTTP/1 forwarding: one request out, one response back, on pooled upstreams.

Shell. `serve_request` carries out what the gate decided for an absolute-form request:
forward the head (hop-by-hop fields removed, `Host` set; byte-identical when nothing needs
rewriting, docs/wire.md), relay the body with its framer, read the response head (1xx relayed,
101 refused: `gate.response_step`), relay the response body, and hand the upstream back to the
pool when both sides may go on.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import ProtocolError, TargetError
from ..policy.target import IPAddress, Target, host_header, make_target
from . import rewrite, wire
from .chunked import ChunkedScanner
from .fairshare import Ticket
from .gate import Refuse, Refused, keep_alive_after, refuse_request, refuse_upstream, response_step
from .record import AccessRecord, perf_counter_ns
from .relay import Framer, LengthFramer, RelayEnded, Side

if TYPE_CHECKING:
    from .conn import Conn
    from .steps import Steps


@dataclass(frozen=True, slots=True)
class _Request:
    """An absolute-form request being forwarded: the head and what was judged and dialed."""

    head: wire.RequestHead
    target: Target
    path: str
    explicit_port: bool
    addr: IPAddress


async def serve_request(steps: Steps, conn: Conn, head: wire.RequestHead) -> bool:
    """One absolute-form request; True if the client connection may serve another."""
    rec = AccessRecord(conn.client, head.method, "http", "", 0, perf_counter_ns())
    upstream: Side | None = None
    turn: Ticket | None = None  # this request's slot of its client (fairshare.py)
    try:
        parsed = steps.gate.request_target(head.target)
        if isinstance(parsed, Refuse):
            if parsed.where is not None:  # ws:// names a destination: the policy first
                await _judge_websocket(steps, conn, head, rec, parsed)
            raise Refused(parsed)
        target, path, explicit_port = parsed
        rec.host, rec.port, rec.path = target.host, target.port, path
        identity = steps.identify(conn, head, rec)
        _, addrs = await steps.authorize(identity.policy, target, rec)
        if conn.owner is not None:  # a fair share: at most N of this client's at once
            turn = steps.turns.try_take(conn.owner)  # (after DNS: a slow name holds none)
            if turn is None:
                turn = await steps.turns.take(conn.owner)
        upstream, addr = await steps.pool.acquire(addrs, target.port)
        conn.upstream = upstream
        rec.addr = steps.addr_text(addr)
        steps.opened(conn, rec)
        request = _Request(head, target, path, explicit_port, addr)
        return await _exchange(steps, conn, request, upstream, rec)
    except Refused as refused:
        if upstream is not None:
            upstream.close()
        return answer_refusal(steps, conn, head, rec, refused.refusal)
    finally:
        conn.upstream = None
        if turn is not None:
            steps.turns.give_back(turn)


async def _judge_websocket(
    steps: Steps, conn: Conn, head: wire.RequestHead, rec: AccessRecord, refusal: Refuse
) -> None:
    """A `ws://`/`wss://` request is refused (docs/proxy.md#websocket), but an attempt on a
    destination the policy refuses is that refusal (403 `block_rule`...), as a curl
    `Upgrade` request to the same host is; raises `Refused` with it. Returns when the policy
    may let the destination through, so the caller answers the 400 that says what to do."""
    assert refusal.where is not None
    host, port = refusal.where
    secure = head.target[:6].lower() == "wss://"
    rec.host, rec.port = host, port
    try:
        target = make_target("https" if secure else "http", host, port)
    except TargetError:
        return
    identity = steps.identify(conn, head, rec)
    early = steps.gate.refuse_early(steps.gate.decide(identity.policy, target))
    if early is not None:  # no DNS: the 400 is the answer for anything else
        raise Refused(early)


def answer_refusal(
    steps: Steps, conn: Conn, head: wire.RequestHead, rec: AccessRecord, refusal: Refuse
) -> bool:
    """Answer and audit a refused request; True if the client connection may go on."""
    if refusal.where is not None:  # ws://: name the destination
        rec.host, rec.port = refusal.where
    keep = keep_alive_after(
        refusal,
        bodiless=head.framing.kind == "none",
        keep_alive=head.keep_alive,
        closing=steps.closing,
    )
    steps.answer(conn, rec, refusal, close=not keep)
    return keep


async def _exchange(
    steps: Steps, conn: Conn, req: _Request, upstream: Side, rec: AccessRecord
) -> bool:
    """Send the request, relay the response; True if the client connection may go on."""
    head = req.head
    try:
        out = request_out(head, conn.raw_head, req.target, req.path, req.explicit_port)
    except (ValueError, UnicodeEncodeError) as exc:
        raise Refused(refuse_request(f"cannot forward request: {exc}")) from None
    upstream.write(out)
    body = framer_for(head.framing, 400)
    req_done = conn.side.start_relay(upstream, body) if body is not None else None
    if req_done is not None:
        # a malformed or truncated request body ends the exchange at once
        req_done.add_done_callback(lambda f: _abort_on_error(f, upstream))
    try:
        resp, resp_raw = await _read_response(conn, head, upstream)
    except Refused:
        if req_done is not None:
            _raise_body_error(req_done)
        raise
    keep, out = response_out(steps, head, resp, resp_raw, rec)
    ok = await _relay_response(conn, resp, upstream, out, rec)
    if req_done is not None:
        if not req_done.done():
            conn.side.close()  # the upstream answered before the body ended: stop both
        ok = _settle(req_done) and ok
    return finish_exchange(
        steps, conn, upstream, resp, rec, keep and ok, ok, req.addr, req.target.port
    )


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


def response_out(
    steps: Steps,
    head: wire.RequestHead,
    resp: wire.ResponseHead,
    resp_raw: bytes,
    rec: AccessRecord,
) -> tuple[bool, bytes]:
    """(keep-alive so far, the response head to send the client)."""
    rec.status = resp.status
    keep = head.keep_alive and resp.keep_alive and not steps.closing
    passthrough = keep and head.version == "HTTP/1.1"
    raw = rewrite.passthrough_response_head(resp, resp_raw) if passthrough else None
    if raw is not None:
        return keep, raw
    rfields = rewrite.forward_response_headers(resp)
    if not keep:
        rfields.append(("Connection", "close"))
    elif head.version == "HTTP/1.0":
        rfields.append(("Connection", "keep-alive"))
    return keep, rewrite.serialize_response_head(resp.status, resp.reason, rfields)


def finish_exchange(
    steps: Steps,
    conn: Conn,
    upstream: Side,
    resp: wire.ResponseHead,
    rec: AccessRecord,
    keep: bool,
    ok: bool,
    addr: IPAddress,
    port: int,
) -> bool:
    """Audit an exchange that ended and pool (or close) its upstream; True if the client
    connection may go on."""
    keep = keep and resp.framing.kind != "close"
    rec.bytes_up = conn.side.bytes_relayed
    rec.bytes_down = upstream.bytes_relayed
    conn.side.bytes_relayed = upstream.bytes_relayed = 0
    rec.finish()
    steps.emit(rec, "allow", rec.reason or "", rec.rule, None, resp.status)
    if ok and resp.keep_alive:
        steps.pool.release(upstream, addr, port)
    else:
        upstream.close()
    return keep


async def _relay_response(
    conn: Conn, resp: wire.ResponseHead, upstream: Side, head_bytes: bytes, rec: AccessRecord
) -> bool:
    """Write the response head and relay its body (one write when it is all buffered)."""
    kind = resp.framing.kind
    if kind == "none":
        conn.side.write(head_bytes)
        return True
    if kind == "close":
        conn.side.write(head_bytes)
        with contextlib.suppress(RelayEnded):
            await upstream.start_relay(conn.side, None)
        return True
    framer = framer_for(resp.framing, 502)
    if framer is None:  # Content-Length: 0
        conn.side.write(head_bytes)
        return True
    try:
        await upstream.start_relay(conn.side, framer, prefix=head_bytes)
    except RelayEnded as exc:
        rec.end = f"upstream_{exc.reason}"
        return False
    return True


async def _read_response(
    conn: Conn, head: wire.RequestHead, upstream: Side
) -> tuple[wire.ResponseHead, bytes]:
    """The final response head (1xx relayed on the way) and its exact bytes."""
    searched = 0
    while True:
        try:
            parsed = wire.parse_response_head(
                upstream.buf, request_method=head.method, searched=searched
            )
        except ProtocolError as exc:
            raise Refused(refuse_upstream(f"malformed response: {exc}")) from None
        if parsed is not None:
            resp, used = parsed
            raw = bytes(upstream.buf[:used])
            upstream.consume(used)
            step = response_step(resp.status)
            if step == "interim":
                conn.side.write(raw)
                searched = 0
                continue
            if isinstance(step, Refuse):
                raise Refused(step)
            return resp, raw
        searched = len(upstream.buf)
        if not await upstream.read_more():
            raise Refused(refuse_upstream("upstream closed before a response"))


def framer_for(framing: wire.BodyFraming, status: int) -> Framer | None:
    if framing.kind == "length":
        return LengthFramer(framing.length) if framing.length else None
    if framing.kind == "chunked":
        return ChunkedScanner(error_status=status)
    return None


def _raise_body_error(req_done: asyncio.Future[None]) -> None:
    """If the request body relay failed, answer that (400) rather than the upstream's fate."""
    if not req_done.done() or _settle(req_done):
        if not req_done.done():
            _settle(req_done)
        return
    exc = req_done.exception() if not req_done.cancelled() else None
    if isinstance(exc, RelayEnded) and exc.reason == "protocol":
        raise Refused(refuse_request(f"malformed request body: {exc}"))
    raise Refused(refuse_request("client closed inside the request body"))


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
    "answer_refusal",
    "finish_exchange",
    "framer_for",
    "request_out",
    "response_out",
    "serve_request",
]

"""A SOCKS5 connection: handshake by `socks5` (pure), then the CONNECT steps (tunnel.py).

Strategy: read the greeting, the RFC 1929 credentials and the CONNECT request with the pure
parsers (the connection is in phase `hello`, so the sweeper closes a client that stalls there
after `head_timeout`); identify the client by its listener or its token (the gate's
`identify`, the password as a Basic credential's); then authorize, resolve, guard, dial,
SNI-check and relay exactly as for an HTTP CONNECT (`Steps`, `tunnel.relay_tunnel`),
answering refusals with an RFC 1928 reply code instead of an HTTP status. Records are CONNECT
records with `mode: "socks5"` (docs/audit-log.md).
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from ..errors import TargetError
from ..policy.target import make_target
from ..printable import printable
from . import socks5
from .clients import Identity
from .gate import Refused, refuse_request
from .record import AccessRecord, perf_counter_ns
from .relay import Side
from .tunnel import check_sni, relay_tunnel

if TYPE_CHECKING:
    from .conn import Conn
    from .steps import Steps

T = TypeVar("T")


async def read_message(side: Side, parse: Callable[[bytearray], tuple[T, int] | None]) -> T | None:
    """The next message `parse` recognizes in `side`'s buffer; None if the peer ended first.
    `SocksError` (or another parser error) propagates."""
    while True:
        if side.buf:
            parsed = parse(side.buf)
            if parsed is not None:
                message, used = parsed
                side.consume(used)
                return message
        if not await side.read_more():
            return None


async def serve_socks(steps: Steps, conn: Conn) -> None:
    """Serve one SOCKS5 client connection to its end (the caller closes the sockets)."""
    rec = AccessRecord(conn.client, "CONNECT", "https", "", 0, perf_counter_ns())
    rec.mode = "socks5"
    conn.phase, conn.phase_since = "hello", steps.loop.time()
    side = conn.side
    upstream: Side | None = None
    try:
        identity = await _handshake(steps, conn, rec)
        if identity is None:
            return
        request = await read_message(side, socks5.parse_request)
        if request is None:
            return
        # a name the agent chose: escaped until normalized, so a raw newline or ANSI escape
        # never reaches stderr, a summary or on_decision (docs/threat-model.md)
        rec.host, rec.port = printable(request.host), request.port
        try:
            target = make_target("https", request.host, request.port)
        except TargetError as exc:
            raise Refused(refuse_request(printable(str(exc)))) from None
        rec.host = target.host
        conn.phase, conn.served = "active", True
        admitted, addrs = await steps.authorize(identity.policy, target, rec)
        upstream, addr = await steps.pool.dial(addrs, target.port)
        conn.upstream = upstream
        rec.addr = steps.addr_text(addr)
        steps.opened(conn, rec)
        side.write(socks5.reply(socks5.REP_SUCCEEDED))
        rec.socks_reply = socks5.REP_SUCCEEDED
        await check_sni(steps, conn, identity.policy, target, admitted, rec)
    except socks5.SocksError as exc:
        conn.served = True
        if exc.reply is not None:
            side.write(socks5.reply(exc.reply))
            rec.socks_reply = exc.reply
        rec.finish()
        steps.emit(rec, "error", exc.reason, None, str(exc), None)
        return
    except Refused as refused:
        r = refused.refusal
        if rec.socks_reply is None:  # not yet answered (after it: SNI, just close)
            rec.socks_reply = socks5.reply_for(r.reason.value)
            side.write(socks5.reply(rec.socks_reply))
        if upstream is not None:
            upstream.close()
        rec.finish()
        steps.emit(rec, r.decision, r.reason.value, r.rule, r.detail, None)
        return
    await relay_tunnel(steps, conn, upstream, rec, status=None)


async def _handshake(steps: Steps, conn: Conn, rec: AccessRecord) -> Identity | None:
    """Method selection and RFC 1929 credentials; the identity, or None when refused."""
    side = conn.side
    greeting = await read_message(side, socks5.parse_greeting)
    if greeting is None:
        return None
    bound = conn.listener.identity
    require = steps.gate.clients.require_auth and bound is None
    method = socks5.choose_method(greeting, require)
    side.write(socks5.method_reply(method))
    if method == socks5.METHOD_UNACCEPTABLE:
        conn.served = True
        steps.emit(rec, "block", "auth_required", None, "SOCKS5 client offered no acceptable "
                   "authentication method (username/password required)", None)  # fmt: skip
        return None
    authorization = None
    if method == socks5.METHOD_USERPASS:
        creds = await read_message(side, socks5.parse_credentials)
        if creds is None:
            return None
        pair = f"{creds.username}:{creds.password}".encode()
        authorization = "Basic " + base64.b64encode(pair).decode("ascii")
    try:
        identity = steps.identify_as(conn, authorization, rec)
    except Refused as refused:
        conn.served = True
        if method == socks5.METHOD_USERPASS:
            side.write(socks5.auth_reply(False))
        r = refused.refusal
        steps.emit(rec, r.decision, r.reason.value, None, r.detail, None)
        return None
    if method == socks5.METHOD_USERPASS:
        side.write(socks5.auth_reply(True))
    return identity

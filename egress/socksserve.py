"""A SOCKS5 connection: handshake by `socks5` (pure), then the proxy's CONNECT path.

Strategy: read the greeting, the RFC 1929 credentials and the CONNECT request with the pure
parsers (the connection is in phase `hello`, so the sweeper closes a client that stalls there
after `head_timeout`); identify the client by its listener or its token; then authorize,
resolve, guard, dial, SNI-check and relay exactly as for an HTTP CONNECT (the same
`EgressProxy` methods), answering refusals with an RFC 1928 reply code instead of an HTTP
status. Records are CONNECT records with `mode: "socks5"` (docs/audit-log.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from . import socks5
from .clients import AuthError, Identity, source_address
from .errors import TargetError
from .relay import Side
from .target import IPAddress, make_target

if TYPE_CHECKING:
    from .server import EgressProxy, _Conn

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


async def serve_socks(proxy: EgressProxy, conn: _Conn) -> None:
    """Serve one SOCKS5 client connection to its end (the caller closes the sockets)."""
    from .server import _Refused

    assert proxy._loop is not None
    t0 = proxy._loop.time()
    conn.phase, conn.phase_since = "hello", t0
    event = proxy._event(conn, "CONNECT", "https", "", 0)  # with mode "socks5"
    side = conn.side
    try:
        identity = await _handshake(proxy, conn, event)
        if identity is None:
            return
        event["client_id"] = identity.client_id
        request = await read_message(side, socks5.parse_request)
        if request is None:
            return
        event["host"], event["port"] = request.host, request.port
        try:
            target = make_target("https", request.host, request.port)
        except TargetError as exc:
            raise _Refused("bad_request", str(exc), "error") from None
        event["host"] = target.host
        conn.phase = "active"
        decision, addrs = await proxy._authorize(identity, target, event)
        upstream, addr = await proxy._dial(addrs, target.port)
        conn.upstream = upstream
        event["addr"] = proxy._addr_text(addr)
        side.write(socks5.reply(socks5.REP_SUCCEEDED))
        event["socks_reply"] = socks5.REP_SUCCEEDED
        if proxy._wants_sni_check(identity.policy, target):
            await proxy._check_sni(conn, identity, target, decision, event)
    except socks5.SocksError as exc:
        if exc.reply is not None:
            side.write(socks5.reply(exc.reply))
            event["socks_reply"] = exc.reply
        _refused(proxy, event, exc.reason, str(exc), "error", None, t0)
        return
    except _Refused as refused:
        if "socks_reply" not in event:  # not yet answered (after it: SNI, just close)
            code = socks5.reply_for(refused.reason)
            side.write(socks5.reply(code))
            event["socks_reply"] = code
        _refused(proxy, event, refused.reason, refused.detail, refused.decision,
                 refused.rule, t0)  # fmt: skip
        return
    await proxy._relay_tunnel(conn, upstream, event, t0, status=None)


async def _handshake(proxy: EgressProxy, conn: _Conn, event: dict[str, object]) -> Identity | None:
    """Method selection and RFC 1929 credentials; the identity, or None when refused."""
    side = conn.side
    greeting = await read_message(side, socks5.parse_greeting)
    if greeting is None:
        return None
    bound = conn.listener.identity
    require = proxy.clients.require_auth and bound is None
    method = socks5.choose_method(greeting, require)
    side.write(socks5.method_reply(method))
    if method == socks5.METHOD_UNACCEPTABLE:
        _refused(
            proxy,
            event,
            "auth_required",
            "SOCKS5 client offered no acceptable "
            "authentication method (username/password required)",
            "block",
            None,
            None,
        )
        return None
    token: str | None = None
    if method == socks5.METHOD_USERPASS:
        creds = await read_message(side, socks5.parse_credentials)
        if creds is None:
            return None
        token = creds.password or creds.username
    try:
        identity = bound or proxy.clients.identify_token(_source(proxy, conn), token)
    except AuthError as exc:
        side.write(socks5.auth_reply(False))
        _refused(proxy, event, exc.reason, str(exc), "block", None, None)
        return None
    if method == socks5.METHOD_USERPASS:
        side.write(socks5.auth_reply(True))
    return identity


def _source(proxy: EgressProxy, conn: _Conn) -> IPAddress | None:
    return source_address(conn.peer) if proxy.clients.by_source else None


def _refused(
    proxy: EgressProxy, event: dict[str, object], reason: str, detail: str, decision: str,
    rule: str | None, t0: float | None,
) -> None:  # fmt: skip
    assert proxy._loop is not None
    if t0 is not None:
        event["duration_ms"] = round((proxy._loop.time() - t0) * 1000, 3)
    proxy._emit(event, decision, reason, rule, detail, None)

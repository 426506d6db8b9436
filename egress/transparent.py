"""Transparent connections: TCP that netfilter redirected to the sandbox's listener.

Strategy (docs/proxy.md#transparent-mode-and-socks5). The original destination comes from
`SO_ORIGINAL_DST` (IPv4; a cut disables IPv6). The connection is then judged *by name*, and
the name judged is the one resolved and dialed, never the address the client chose:

- port 80: plain HTTP. Each request head is read and turned into the absolute form
  `http://HOST:PORT/path` from its `Host` (or, without one, the fake-IP name, or the original
  address), then served by the forward proxy's own per-request path (same decisions, same
  answers, keep-alive with a decision per request);
- port 443, or a port an `https://` allow rule names: TLS. The ClientHello's SNI is the name;
  without SNI, the fake-IP name (or the address) under the `sni_missing` option, as for
  CONNECT;
- any other port: a raw TCP tunnel to the fake-IP name (the DNS responder's answer for that
  address) or, for an address the responder never gave out, to the address itself; both go
  through the policy and the guard as a CONNECT to `NAME:PORT` would (`github.com:22`).

Refusals of tunnels reset the connection (there is no protocol to answer in); HTTP refusals
get the forward proxy's error response. Every attempt is audited with `mode: transparent`
and `orig_dst`. DoS bounds are the proxy's: the sweeper closes a connection that stalls in its
ClientHello or request head after `head_timeout`.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from dataclasses import replace
from typing import TYPE_CHECKING

from .clients import Identity
from .errors import ProtocolError, TargetError
from .sni import MAX_HELLO_INPUT, ClientHelloResult, parse_client_hello
from .target import Target, make_target, split_host_port

if TYPE_CHECKING:
    from .server import EgressProxy, _Conn

SO_ORIGINAL_DST = 80  # linux/netfilter_ipv4.h
HTTP_PORT = 80
TLS_PORT = 443


def original_dst(conn: _Conn) -> tuple[ipaddress.IPv4Address, int] | None:
    """The address the client connected to before netfilter redirected it, or None."""
    transport = conn.side.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None:
        return None
    try:
        raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    except OSError:
        return None
    return parse_sockaddr_in(raw)


def parse_sockaddr_in(raw: bytes) -> tuple[ipaddress.IPv4Address, int] | None:
    """A `struct sockaddr_in` (family, port, address) as (address, port); None if not IPv4."""
    if len(raw) < 8 or struct.unpack("=H", raw[:2])[0] != socket.AF_INET:
        return None
    port = struct.unpack("!H", raw[2:4])[0]
    return ipaddress.IPv4Address(raw[4:8]), port


async def serve_transparent(proxy: EgressProxy, conn: _Conn) -> None:
    """Serve one redirected connection to its end (the caller closes the sockets)."""
    from .server import _Refused

    assert proxy._loop is not None
    identity = conn.listener.identity
    if identity is None:  # its sandbox was released
        return
    t0 = proxy._loop.time()
    dst = original_dst(conn)
    if dst is None:
        event = proxy._event(conn, "CONNECT", "https", "", 0)
        event["client_id"] = identity.client_id
        _reset(proxy, conn, event, _Refused("not_redirected", "no original destination "
                                            "(not a redirected connection)", "error"), t0)
        return
    addr, port = dst
    conn.orig_dst = f"{addr}:{port}"
    pool = conn.listener.fake_ips
    name = pool.name_for(addr) if pool is not None else None
    if port == HTTP_PORT:
        await _serve_http(proxy, conn, name or str(addr), port)
    elif port == TLS_PORT or port in identity.policy.https_ports:
        await _serve_tls(proxy, conn, identity, name, dst, t0)
    else:
        await _serve_raw(proxy, conn, identity, name or str(addr), dst, t0)


async def _serve_raw(
    proxy: EgressProxy, conn: _Conn, identity: Identity, host: str,
    dst: tuple[ipaddress.IPv4Address, int], t0: float,
) -> None:  # fmt: skip
    """A raw TCP tunnel judged as a CONNECT to `host:port`."""
    from .server import _Refused

    event = _tunnel_event(proxy, conn, identity, host, dst)
    conn.phase = "active"
    try:
        target = _target(host, dst[1])
        await _open(proxy, conn, identity, target, event)
    except _Refused as refused:
        _reset(proxy, conn, event, refused, t0)
        return
    await proxy._relay_tunnel(conn, conn.upstream, event, t0, status=None)


async def _serve_tls(
    proxy: EgressProxy, conn: _Conn, identity: Identity, name: str | None,
    dst: tuple[ipaddress.IPv4Address, int], t0: float,
) -> None:  # fmt: skip
    """TLS: judged by the ClientHello's SNI; without one, by the fake-IP name (or address)
    under the `sni_missing` option. The ClientHello is then relayed unchanged."""
    from .server import _Refused

    fallback = name or str(dst[0])
    event = _tunnel_event(proxy, conn, identity, fallback, dst)
    try:
        hello = await _read_hello(proxy, conn)
        if hello is not None and hello.kind == "malformed":
            raise _Refused("sni_mismatch", "malformed TLS ClientHello")
        sni = hello.sni if hello is not None and hello.kind == "tls" else None
        if sni is not None:
            event["sni"] = sni
        target = _target(sni or fallback, dst[1])
        event["host"] = target.host
        decision, addrs = await proxy._authorize(identity, target, event)
        if sni is None and not proxy._sni_missing_ok(target, decision):
            kind = "no ClientHello" if hello is None else f"{hello.kind} first bytes"
            raise _Refused("sni_missing", f"connection carried {kind}; policy requires SNI")
        conn.upstream, addr = await proxy._dial(addrs, target.port)
        event["addr"] = proxy._addr_text(addr)
    except _Refused as refused:
        _reset(proxy, conn, event, refused, t0)
        return
    await proxy._relay_tunnel(conn, conn.upstream, event, t0, status=None)


async def _read_hello(proxy: EgressProxy, conn: _Conn) -> ClientHelloResult | None:
    assert proxy._loop is not None
    side = conn.side
    conn.phase, conn.phase_since = "hello", proxy._loop.time()
    side.max_buffer = MAX_HELLO_INPUT
    while True:
        hello = parse_client_hello(side.buf)
        if hello is not None or not await side.read_more():
            break
    side.max_buffer = proxy.limits.max_head
    conn.phase = "active"
    return hello


async def _open(
    proxy: EgressProxy, conn: _Conn, identity: Identity, target: Target,
    event: dict[str, object],
) -> None:  # fmt: skip
    """Authorize, resolve, guard and dial `target`. Raises `_Refused`."""
    _, addrs = await proxy._authorize(identity, target, event)
    conn.upstream, addr = await proxy._dial(addrs, target.port)
    event["addr"] = proxy._addr_text(addr)


def _target(host: str, port: int) -> Target:
    from .server import _Refused

    try:
        return make_target("https", host, port)
    except TargetError as exc:
        raise _Refused("bad_request", str(exc), "error") from None


def _tunnel_event(
    proxy: EgressProxy, conn: _Conn, identity: Identity, host: str,
    dst: tuple[ipaddress.IPv4Address, int],
) -> dict[str, object]:  # fmt: skip
    event = proxy._event(conn, "CONNECT", "https", host, dst[1])
    event["client_id"] = identity.client_id
    return event


def _reset(
    proxy: EgressProxy, conn: _Conn, event: dict[str, object], refused: object, t0: float
) -> None:
    """Refuse a tunnel: reset the client connection, audit the refusal."""
    from .server import _Refused

    assert isinstance(refused, _Refused)
    assert proxy._loop is not None
    conn.side.abort()  # RST: there is no protocol to answer in
    if conn.upstream is not None:
        conn.upstream.close()
    event["end"] = "reset"
    event["duration_ms"] = round((proxy._loop.time() - t0) * 1000, 3)
    proxy._emit(event, refused.decision, refused.reason, refused.rule, refused.detail, None)


async def _serve_http(proxy: EgressProxy, conn: _Conn, fallback: str, port: int) -> None:
    """Plain HTTP: every request head becomes absolute-form from its Host and goes through
    the forward proxy's per-request path (a decision per request, keep-alive)."""
    assert proxy._loop is not None
    while True:
        try:
            head = await proxy._read_head(conn)
        except ProtocolError as exc:
            reason = "head_too_large" if exc.status == 431 else "bad_request"
            proxy._refuse_now(conn, reason, str(exc), exc.status, answer=True)
            return
        if head is None:
            return
        conn.phase = "active"
        absolute = absolute_form(head.target, head.get("host"), fallback, port)
        if head.method == "CONNECT" or absolute is None:
            proxy._refuse_now(conn, "bad_request", f"unsupported request target "
                              f"{head.target[:100]!r} on a transparent connection", 400,
                              answer=True)  # fmt: skip
            return
        keep = await proxy._http(conn, replace(head, target=absolute))
        conn.phase, conn.phase_since = "idle", proxy._loop.time()
        if not keep:
            return


def absolute_form(target: str, host: str | None, fallback: str, port: int) -> str | None:
    """`http://HOST:PORT/path` for an origin-form `target` on a redirected connection to
    `port`: HOST from the `Host` field's host (its port is ignored: the connection's port is
    where the client was going), else `fallback`. None for a target that is not origin-form
    (asterisk, authority or absolute form), or a Host that cannot be a host."""
    if not target.startswith("/"):
        return None
    name = fallback
    if host:
        try:
            name = split_host_port(host.strip())[0]
        except TargetError:
            name = host.strip()  # judged (and refused) as written
    if not name or any(c in name for c in "/?#@\\ \t"):
        return None  # not a host: it would move the path (a 400, never a destination)
    if ":" in name and not name.startswith("["):
        name = f"[{name}]"
    return f"http://{name}:{port}{target}"

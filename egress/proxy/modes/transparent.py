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

What needs no socket is plain functions, tested without one: how a connection is served
(`kind_of` its port), the name it is judged as (`tls_target`: the SNI; the fake-IP name; the
address), its `Intent`, and a port-80 request made absolute-form from its `Host`
(`absolute_form`); its answers are `kinds.TRANSPARENT` and `kinds.TRANSPARENT_HTTP`.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from collections.abc import Collection
from dataclasses import replace
from typing import TYPE_CHECKING, Final, Literal

from ...errors import ProtocolError, TargetError
from ...policy.target import Target, make_target, split_host_port
from ...reasons import Reason
from ..codec.tls_hello import ClientHelloResult
from ..core.clients import Identity
from ..core.exchange import Exchange
from ..core.gate import Verdict, refuse_head, refuse_request
from ..core.intent import Intent
from ..core.record import AccessRecord, perf_counter_ns
from ..drive.coroutine import drive, read_hello
from ..drive.tunnel import relay_tunnel
from ..net.conn import read_head
from .http import serve_request
from .kinds import TRANSPARENT

if TYPE_CHECKING:
    from ..net.conn import Conn
    from ..runtime import Steps

HTTP_PORT: Final = 80
TLS_PORT: Final = 443
Kind = Literal["http", "tls", "raw"]
NOT_REDIRECTED: Final = Verdict(
    Reason.NOT_REDIRECTED, "no original destination (not a redirected connection)"
)


def tunnel_intent(
    client: str,
    orig_dst: str | None,
    host: str,
    port: int,
    target: Target | Verdict,
    identity: Identity | None,
    *,
    cap: Verdict | None = None,
    hello: ClientHelloResult | None = None,
    hello_first: bool = False,
    t0: int | None = None,
) -> Intent:
    """A redirected connection as an intent: a CONNECT to `host:port` from the listener's
    client (`orig_dst`: where it was going)."""
    return Intent(
        client,
        "CONNECT",
        "https",
        host,
        port,
        perf_counter_ns() if t0 is None else t0,
        target,
        identity,
        cap,
        orig_dst=orig_dst,
        hello=hello,
        hello_first=hello_first,
    )


def tunnel_target(host: str, port: int) -> Target | Verdict:
    """The tunnel's target: the name (SNI, fake-IP name) or address it is judged as."""
    try:
        return make_target("https", host, port)
    except TargetError as exc:
        return refuse_request(str(exc))


def tls_target(hello: ClientHelloResult | None, fallback: str, port: int) -> Target | Verdict:
    """TLS is judged by its ClientHello's SNI; without one, by `fallback` (the fake-IP name or
    the address), under the `sni_missing` option; a malformed ClientHello is refused."""
    if hello is not None and hello.kind == "malformed":
        return Verdict(Reason.SNI_MISMATCH, "malformed TLS ClientHello")
    sni = hello.sni if hello is not None and hello.kind == "tls" else None
    return tunnel_target(sni or fallback, port)


def kind_of(port: int, https_ports: Collection[int]) -> Kind:
    """How a redirected connection to `port` is served: HTTP requests on 80, TLS on 443 and
    the ports an `https://` rule names, a raw tunnel on any other."""
    if port == HTTP_PORT:
        return "http"
    if port == TLS_PORT or port in https_ports:
        return "tls"
    return "raw"


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


SO_ORIGINAL_DST = 80  # linux/netfilter_ipv4.h


def original_dst(conn: Conn) -> tuple[ipaddress.IPv4Address, int] | None:
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


async def serve_transparent(steps: Steps, conn: Conn) -> None:
    """Serve one redirected connection to its end (the caller closes the sockets)."""
    identity = conn.listener.identity
    if identity is None:  # its sandbox was released
        return
    dst = original_dst(conn)
    if dst is None:
        conn.accounted()
        x = Exchange(steps.gate, TRANSPARENT)
        await drive(steps, conn, x, x.start(_intent(conn, "", 0, NOT_REDIRECTED, None)))
        return
    addr, port = dst
    conn.redirected(f"{addr}:{port}")
    probe = conn.listener.probe
    if probe is not None and (str(addr), port) == conn.listener.address:
        if await probe.claims(conn.client):
            _probed(steps, conn, identity)
            return
    pool = conn.listener.fake_ips
    name = pool.name_for(addr) if pool is not None else None
    kind = kind_of(port, identity.policy.https_ports)
    if kind == "http":
        await _serve_http(steps, conn, name or str(addr), port)
    elif kind == "tls":
        await _serve_tls(steps, conn, identity, name or str(addr), port)
    else:
        await _serve_raw(steps, conn, identity, name or str(addr), port)


def _probed(steps: Steps, conn: Conn, identity: Identity) -> None:
    """`prepare_execution`'s probe of this listener: a lifecycle record (method PROBE), not
    a request the agent made (docs/audit-log.md#sandbox-records); the connection is closed."""
    conn.side.close()
    rec = AccessRecord.probe(
        conn.client, conn.listener.address, perf_counter_ns(), conn.orig_dst, identity.client_id
    )
    detail = "prepare_execution's probe of the transparent listener"
    event = rec.event("allow", Reason.LISTENER_PROBE.value, None, detail)
    if steps.audit is not None:  # not a request: no metrics, not in the execution summary
        steps.audit.record(event)
    for hook in steps.hooks:
        hook(event)


def _intent(
    conn: Conn,
    host: str,
    port: int,
    target: Target | Verdict,
    identity: Identity | None,
    *,
    cap: Verdict | None = None,
    hello: ClientHelloResult | None = None,
    hello_first: bool = False,
) -> Intent:
    return tunnel_intent(
        conn.client,
        conn.orig_dst,
        host,
        port,
        target,
        identity,
        cap=cap,
        hello=hello,
        hello_first=hello_first,
    )


async def _serve_raw(steps: Steps, conn: Conn, identity: Identity, host: str, port: int) -> None:
    """A raw TCP tunnel judged as a CONNECT to `host:port`."""
    conn.serving()
    cap = steps.cap(conn, identity)  # the listener's client; per-client cap
    intent = _intent(conn, host, port, tunnel_target(host, port), identity, cap=cap)
    await _exchange(steps, conn, intent)


async def _serve_tls(
    steps: Steps, conn: Conn, identity: Identity, fallback: str, port: int
) -> None:
    """TLS: judged by the ClientHello's SNI; without one, by the fake-IP name (or address)
    under the `sni_missing` option. The ClientHello is then relayed unchanged."""
    conn.accounted()  # recorded however it ends (a silent client: hello_timeout, then reset)
    cap = steps.cap(conn, identity)  # the listener's client; per-client cap
    hello = await read_hello(steps, conn) if cap is None else None
    target = tls_target(hello, fallback, port)
    intent = _intent(conn, fallback, port, target, identity, cap=cap, hello=hello, hello_first=True)
    await _exchange(steps, conn, intent)


async def _exchange(steps: Steps, conn: Conn, intent: Intent) -> None:
    x = Exchange(steps.gate, TRANSPARENT)
    if await drive(steps, conn, x, x.start(intent)) is not None:
        await relay_tunnel(steps, conn, x)


async def _serve_http(steps: Steps, conn: Conn, fallback: str, port: int) -> None:
    """Plain HTTP: every request head becomes absolute-form from its Host and goes through
    the forward proxy's per-request path (a decision per request, keep-alive)."""
    while True:
        try:
            head = await read_head(conn, steps.limits, steps.loop)
        except ProtocolError as exc:
            steps.refuse_now(conn, refuse_head(exc))
            return
        if head is None:
            return
        conn.serving()
        absolute = absolute_form(head.target, head.get("host"), fallback, port)
        if head.method == "CONNECT" or absolute is None:
            steps.refuse_now(
                conn,
                refuse_request(
                    f"unsupported request target {head.target[:100]!r} on a transparent connection"
                ),
            )
            return
        keep = await serve_request(steps, conn, replace(head, target=absolute))
        conn.request_ended(steps.loop.time())
        if not keep:
            return


__all__ = [
    "HTTP_PORT",
    "NOT_REDIRECTED",
    "TLS_PORT",
    "Kind",
    "absolute_form",
    "kind_of",
    "original_dst",
    "parse_sockaddr_in",
    "serve_transparent",
    "tls_target",
    "tunnel_intent",
    "tunnel_target",
]

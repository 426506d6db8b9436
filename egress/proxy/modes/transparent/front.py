"""The transparent front-end: redirected TCP as an `Intent`, refused with a reset.

Pure. How a redirected connection is served (`kind_of` its port), the name it is judged as
(`tls_target`: the SNI; the fake-IP name; the address), its `Intent`, and a port-80 request
made absolute-form from its `Host` (`absolute_form`); `serve.py` reads the original
destination and the bytes. A redirected tunnel (TLS judged by its SNI, or raw TCP) has no
protocol to answer in, so every refusal is a TCP reset (`end: reset`); its port-80 requests
are HTTP requests and answered as the forward proxy's are
(docs/proxy.md#transparent-mode-and-socks5).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Final, Literal

from ....errors import TargetError
from ....policy.target import Target, make_target, split_host_port
from ....reasons import Reason
from ...codec.tls_hello import ClientHelloResult
from ...core.clients import Identity
from ...core.gate import Verdict, refuse_request
from ...core.intent import CLOSE, NEVER_REFUSED, RESET, Front, Intent
from ...core.record import perf_counter_ns
from ..http.front import http_answers

TRANSPARENT: Final = Front(
    "transparent",
    "transparent",
    "tunnel",
    None,
    {r: CLOSE if r in NEVER_REFUSED else RESET for r in Reason},
)
# port 80 through a transparent listener: requests, answered in HTTP, recorded `transparent`
TRANSPARENT_HTTP: Final = Front("transparent-http", "transparent", "request", None, http_answers())

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


__all__ = [
    "HTTP_PORT",
    "NOT_REDIRECTED",
    "TLS_PORT",
    "TRANSPARENT",
    "TRANSPARENT_HTTP",
    "Kind",
    "absolute_form",
    "kind_of",
    "tls_target",
    "tunnel_intent",
    "tunnel_target",
]

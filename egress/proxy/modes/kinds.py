"""Each listener mode as data: its front-ends' answers, one per `Reason`, and its `ListenerMode`.

Pure. A front-end is what the exchange needs of a mode (docs/architecture.md#one-exchange):
its answer for every reason (an HTTP status, an RFC 1928 reply, a DNS rcode, a reset or a
plain close; a test proves every table names every reason, so the audit reasons and the
answers cannot drift apart), what it records as its `mode`, and what follows the decision.
The listener kinds (`http`, `socks5`, `transparent`, `dns`, and an `http` listener bound to a
framework route) become one `ListenerMode` object each, so the shell asks the object rather
than testing the kind's string in several places. The tables are here, free of I/O and of
dnspython, because every proxy loads them; `socks5.py`, `transparent.py` and `dns.py` are
loaded with their first listener.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from ...reasons import Reason
from ..codec import socks5 as socks5_codec
from ..core.intent import CLOSE, NEVER_REFUSED, RESET, Answer, Front

# --- HTTP, CONNECT, the forwarder: answered in HTTP, or closed (docs/proxy.md#error-responses)


def http_answers() -> Mapping[Reason, Answer]:
    """Reason -> answer for both HTTP front-ends (requests and CONNECT)."""
    return {r: Answer("http", r.status) if r.answered else CLOSE for r in Reason}


HTTP: Final = Front("http", None, "request", None, http_answers())


# a tunnel refused after its `200` (by the SNI check) is closed, nothing more said
# (docs/proxy.md#tls-sni-check); the exchange then answers `close`, whatever the reason
CONNECT: Final = Front("connect", None, "tunnel", Answer("http", 200), http_answers(), 200)
# relayed to its framework route; whatever stops it closes it unanswered: no protocol to
# answer in. Its records have no `mode` (docs/audit-log.md)
FORWARDER: Final = Front("forwarder", None, "route", None, dict.fromkeys(Reason, CLOSE), 200)

# --- SOCKS5: RFC 1928 replies; a reason with no closer code says so here
# (docs/proxy.md#transparent-mode-and-socks5)


def _reply(code: int) -> Answer:
    return Answer("socks5", code)


NOT_ALLOWED: Final = _reply(socks5_codec.REP_NOT_ALLOWED)
HOST_UNREACHABLE: Final = _reply(socks5_codec.REP_HOST_UNREACHABLE)
GENERAL_FAILURE: Final = _reply(socks5_codec.REP_GENERAL_FAILURE)
SUCCEEDED: Final = _reply(socks5_codec.REP_SUCCEEDED)

R = Reason
SOCKS5_ANSWERS: Final[Mapping[Reason, Answer]] = {
    # verdicts that let a connection through: never a refusal
    R.ALLOW_RULE: SUCCEEDED,
    R.DEFAULT_ALLOW: SUCCEEDED,
    R.FRAMEWORK_ROUTE: SUCCEEDED,
    R.ADDRESS_RULES: SUCCEEDED,
    # the policy and the guard: "connection not allowed by ruleset"
    R.BLOCK_RULE: NOT_ALLOWED,
    R.DEFAULT_DENY: NOT_ALLOWED,
    R.PORT_NOT_ALLOWED: NOT_ALLOWED,
    R.RESERVED_ADDRESS: NOT_ALLOWED,
    R.SNI_MISMATCH: NOT_ALLOWED,  # after the reply: the tunnel is closed, nothing more said
    R.SNI_MISSING: NOT_ALLOWED,
    R.AUTH_REQUIRED: NOT_ALLOWED,  # refused at RFC 1929 authentication, before a request
    R.AUTH_FAILED: NOT_ALLOWED,
    R.NOT_A_NAME: NOT_ALLOWED,
    # the destination
    R.DNS_ERROR: HOST_UNREACHABLE,
    R.DNS_TIMEOUT: GENERAL_FAILURE,  # RFC 1928 has no "lookup timed out"
    R.CONNECTION_REFUSED: _reply(socks5_codec.REP_CONNECTION_REFUSED),
    R.CONNECTION_TIMEOUT: HOST_UNREACHABLE,
    R.UPSTREAM_ERROR: GENERAL_FAILURE,
    # the request itself
    R.BAD_REQUEST: GENERAL_FAILURE,
    R.HEAD_TOO_LARGE: GENERAL_FAILURE,
    R.HEAD_TIMEOUT: GENERAL_FAILURE,
    R.COMMAND_NOT_SUPPORTED: _reply(socks5_codec.REP_COMMAND_NOT_SUPPORTED),
    R.ADDRESS_TYPE_NOT_SUPPORTED: _reply(socks5_codec.REP_ATYP_NOT_SUPPORTED),
    # the proxy's own limits and health: "general SOCKS server failure"
    R.TOO_MANY_CONNECTIONS: GENERAL_FAILURE,
    R.AUDIT_UNAVAILABLE: GENERAL_FAILURE,
    R.IDENTIFY_TIMEOUT: GENERAL_FAILURE,
    R.EVICTED: GENERAL_FAILURE,
    # other listeners' reasons: never on a SOCKS5 listener
    R.NOT_REDIRECTED: GENERAL_FAILURE,
    R.POOL_EXHAUSTED: GENERAL_FAILURE,
    R.SANDBOX_ADDED: GENERAL_FAILURE,
    R.SANDBOX_REPLACED: GENERAL_FAILURE,
    R.SANDBOX_REMOVED: GENERAL_FAILURE,
    R.LISTENER_PROBE: GENERAL_FAILURE,
}

SOCKS5: Final = Front("socks5", "socks5", "tunnel", SUCCEEDED, SOCKS5_ANSWERS)

# --- transparent: a redirected tunnel has no protocol to answer in, so every refusal is a TCP
# reset (`end: reset`); its port-80 requests are answered as the forward proxy's are
TRANSPARENT: Final = Front(
    "transparent",
    "transparent",
    "tunnel",
    None,
    {r: CLOSE if r in NEVER_REFUSED else RESET for r in Reason},
)
# port 80 through a transparent listener: requests, answered in HTTP, recorded `transparent`
TRANSPARENT_HTTP: Final = Front("transparent-http", "transparent", "request", None, http_answers())

# --- DNS: a name the policy refuses gets NXDOMAIN, a full pool SERVFAIL, a closed audit log
# REFUSED (docs/proxy.md#transparent-mode-and-socks5)
NOERROR: Final = Answer("dns", 0)
FORMERR: Final = Answer("dns", 1)
SERVFAIL: Final = Answer("dns", 2)
NXDOMAIN: Final = Answer("dns", 3)
REFUSED: Final = Answer("dns", 5)

DNS_ANSWERS: Final[Mapping[Reason, Answer]] = {
    R.ALLOW_RULE: NOERROR,
    R.DEFAULT_ALLOW: NOERROR,
    R.FRAMEWORK_ROUTE: NOERROR,
    R.ADDRESS_RULES: NOERROR,  # answered; each connection judged on its address
    R.BLOCK_RULE: NXDOMAIN,
    R.DEFAULT_DENY: NXDOMAIN,
    R.PORT_NOT_ALLOWED: NXDOMAIN,
    R.RESERVED_ADDRESS: NXDOMAIN,
    R.NOT_A_NAME: NXDOMAIN,
    R.SNI_MISMATCH: NXDOMAIN,
    R.SNI_MISSING: NXDOMAIN,
    R.AUTH_REQUIRED: REFUSED,
    R.AUTH_FAILED: REFUSED,
    R.DNS_ERROR: SERVFAIL,
    R.DNS_TIMEOUT: SERVFAIL,
    R.CONNECTION_REFUSED: SERVFAIL,
    R.CONNECTION_TIMEOUT: SERVFAIL,
    R.UPSTREAM_ERROR: SERVFAIL,
    R.POOL_EXHAUSTED: SERVFAIL,
    # a malformed query: FORMERR (a non-standard opcode gets NOTIMP, a class other than IN
    # REFUSED, a name that is no name NXDOMAIN: the codec's `read_query` says which)
    R.BAD_REQUEST: FORMERR,
    R.HEAD_TOO_LARGE: FORMERR,
    R.HEAD_TIMEOUT: REFUSED,
    R.COMMAND_NOT_SUPPORTED: REFUSED,
    R.ADDRESS_TYPE_NOT_SUPPORTED: REFUSED,
    R.NOT_REDIRECTED: REFUSED,
    R.TOO_MANY_CONNECTIONS: REFUSED,
    R.AUDIT_UNAVAILABLE: REFUSED,
    R.IDENTIFY_TIMEOUT: REFUSED,
    R.EVICTED: REFUSED,
    R.SANDBOX_ADDED: NOERROR,
    R.SANDBOX_REPLACED: NOERROR,
    R.SANDBOX_REMOVED: REFUSED,
    R.LISTENER_PROBE: NOERROR,
}

# DNS records are transparent mode's, and record a closed audit log as `block`
# (docs/audit-log.md#dns-records)
DNS: Final = Front(
    "dns",
    "transparent",
    "lookup",
    None,
    DNS_ANSWERS,
    decisions={R.AUDIT_UNAVAILABLE: "block"},
)


# --- the listener modes


@dataclass(frozen=True, slots=True)
class ListenerMode:
    """What a listener speaks: its front-ends, and whether a refusal at accept is answered
    in HTTP (a forward proxy listener) or the socket just closed (no protocol to answer in)."""

    name: str
    fronts: tuple[Front, ...]
    answers_at_accept: bool
    fast_path: bool  # kept-alive requests may be served from callbacks (docs/architecture.md)
    # the front-end of its HTTP requests (a transparent listener's port 80 records its mode)
    request_front: Front = HTTP


PROXY: Final = ListenerMode("http", (HTTP, CONNECT), answers_at_accept=True, fast_path=True)
ROUTE: Final = ListenerMode("forward", (FORWARDER,), answers_at_accept=False, fast_path=False)
SOCKS: Final = ListenerMode("socks5", (SOCKS5,), answers_at_accept=False, fast_path=False)
REDIRECTED: Final = ListenerMode(
    "transparent",
    (TRANSPARENT, TRANSPARENT_HTTP),
    answers_at_accept=False,
    fast_path=False,
    request_front=TRANSPARENT_HTTP,
)
RESOLVER: Final = ListenerMode("dns", (DNS,), answers_at_accept=False, fast_path=False)
MODES: Final = {m.name: m for m in (PROXY, SOCKS, REDIRECTED, RESOLVER)}


def mode_for(kind: str, forwarding: bool) -> ListenerMode:
    """The mode of a listener of `kind` (`forwarding`: bound to a framework route)."""
    if forwarding:
        return ROUTE
    try:
        return MODES[kind]
    except KeyError:
        raise ValueError(f"unknown listener kind {kind!r}") from None


__all__ = [
    "CONNECT",
    "DNS",
    "DNS_ANSWERS",
    "FORWARDER",
    "HTTP",
    "MODES",
    "PROXY",
    "REDIRECTED",
    "RESOLVER",
    "ROUTE",
    "SOCKS",
    "SOCKS5",
    "SOCKS5_ANSWERS",
    "TRANSPARENT",
    "TRANSPARENT_HTTP",
    "ListenerMode",
    "http_answers",
    "mode_for",
]

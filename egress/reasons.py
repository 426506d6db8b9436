"""One vocabulary of outcomes: every audit `reason` and tunnel `end` the proxy can write.

Pure. A `Reason` carries everything said about it anywhere: the HTTP status of the answer,
the RFC 9209 `Proxy-Status` error type, the usual audit `decision` and a one-line meaning.
The response table (`responses.py`), the audit reader and the docs tables
(docs/audit-log.md#reason-codes, docs/proxy.md#error-responses, docs/policy.md) all come
from or are checked against this module (`tests/unit/test_reasons.py`), so a new reason is
added here once.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final, Literal

DecisionWord = Literal["allow", "block", "error"]
DECISIONS: Final = ("allow", "block", "error")


class Reason(StrEnum):
    """An audit `reason` code (its value is the code; it compares equal to the string)."""

    # (status, Proxy-Status error, usual decision, meaning); status 0 = never answered
    ALLOW_RULE = "allow_rule", 0, "", "allow", "an allow rule matched (`rule` names it)"
    DEFAULT_ALLOW = (
        "default_allow",
        0,
        "",
        "allow",
        "no rule matched and the default posture is allow (`rule` is null)",
    )
    FRAMEWORK_ROUTE = (
        "framework_route",
        0,
        "",
        "allow",
        "the destination is a framework route (`rule` is the route URL)",
    )
    BLOCK_RULE = (
        "block_rule",
        403,
        "http_request_denied",
        "block",
        "a block rule matched (`rule` names it)",
    )
    DEFAULT_DENY = (
        "default_deny",
        403,
        "http_request_denied",
        "block",
        "no rule matched and the default posture is deny (`rule` is null)",
    )
    PORT_NOT_ALLOWED = (
        "port_not_allowed",
        403,
        "http_request_denied",
        "block",
        "the host is allowed, but not on this port or scheme",
    )
    RESERVED_ADDRESS = (
        "reserved_address",
        403,
        "destination_ip_prohibited",
        "block",
        "the destination is or resolved to a reserved address; `detail` names the kind: "
        "`loopback`, `unspecified`, `link_local`, `multicast`, `broadcast`, `reserved`, "
        "`metadata`, `host_local`, `private`, `reserved_extra`",
    )
    SNI_MISMATCH = (
        "sni_mismatch",
        403,
        "http_request_denied",
        "block",
        "the TLS ClientHello named a server (SNI) the policy does not allow on that port",
    )
    SNI_MISSING = (
        "sni_missing",
        403,
        "http_request_denied",
        "block",
        "no SNI, or not TLS, and the CONNECT host was not itself an allowed name",
    )
    DNS_ERROR = "dns_error", 502, "dns_error", "error", "the name did not resolve"
    DNS_TIMEOUT = (
        "dns_timeout",
        504,
        "dns_timeout",
        "error",
        "the resolver did not answer in time, or is saturated by names that do not (504)",
    )
    CONNECTION_REFUSED = (
        "connection_refused",
        502,
        "connection_refused",
        "error",
        "the upstream refused the connection (502)",
    )
    CONNECTION_TIMEOUT = (
        "connection_timeout",
        504,
        "connection_timeout",
        "error",
        "the upstream did not answer within the connect timeout (504)",
    )
    UPSTREAM_ERROR = (
        "upstream_error",
        502,
        "proxy_internal_response",
        "error",
        "the upstream connection failed otherwise",
    )
    BAD_REQUEST = (
        "bad_request",
        400,
        "http_request_error",
        "error",
        "a malformed request (400): origin-form, userinfo, smuggling attempts, bad host",
    )
    HEAD_TOO_LARGE = (
        "head_too_large",
        431,
        "http_request_error",
        "error",
        "a request head over the size or header-count limit (431)",
    )
    HEAD_TIMEOUT = (
        "head_timeout",
        408,
        "http_request_error",
        "error",
        "a request head was not complete within the head timeout (408)",
    )
    AUTH_REQUIRED = (
        "auth_required",
        407,
        "http_request_denied",
        "block",
        "no proxy credentials were presented (407)",
    )
    AUTH_FAILED = (
        "auth_failed",
        407,
        "http_request_denied",
        "block",
        "credentials were presented but not accepted, or not readable (407)",
    )
    TOO_MANY_CONNECTIONS = (
        "too_many_connections",
        503,
        "proxy_internal_error",
        "error",
        "over the concurrent connection limit, global or per client (503)",
    )
    AUDIT_UNAVAILABLE = (
        "audit_unavailable",
        503,
        "proxy_internal_error",
        "error",
        "refused because the audit log cannot be written and `--audit-fail closed`",
    )
    IDENTIFY_TIMEOUT = (
        "identify_timeout",
        0,
        "",
        "error",
        "a connection on a shared listener did not name its client within "
        "`identify_timeout` (closed without an answer; docs/proxy.md#limits)",
    )
    EVICTED = (
        "evicted",
        0,
        "",
        "error",
        "a connection not yet identified was closed to make room for a newer one of the "
        "same source (docs/proxy.md#limits)",
    )
    # the sandbox lifecycle (method SANDBOX, docs/audit-log.md#sandbox-records): not refusals
    SANDBOX_ADDED = (
        "sandbox_added",
        0,
        "",
        "allow",
        "`prepare_execution` bound a sandbox (a sandbox record, method SANDBOX)",
    )
    SANDBOX_REPLACED = (
        "sandbox_replaced",
        0,
        "",
        "allow",
        "a second `prepare_execution` replaced the sandbox's policy",
    )
    SANDBOX_REMOVED = (
        "sandbox_removed",
        0,
        "",
        "block",
        "the sandbox was released, or its prepare failed (`detail` says which)",
    )
    LISTENER_PROBE = (
        "listener_probe",
        0,
        "",
        "allow",
        "transparent: `prepare_execution`'s probe connected to the listener itself "
        "(method PROBE); closed, not a request",
    )

    COMMAND_NOT_SUPPORTED = (
        "command_not_supported",
        0,
        "",
        "error",
        "SOCKS5: BIND or UDP ASSOCIATE (reply `0x07`)",
    )
    ADDRESS_TYPE_NOT_SUPPORTED = (
        "address_type_not_supported",
        0,
        "",
        "error",
        "SOCKS5: an address type other than IPv4, name, IPv6 (reply `0x08`)",
    )
    NOT_REDIRECTED = (
        "not_redirected",
        0,
        "",
        "error",
        "transparent: a connection on the transparent listener without an original "
        "destination (reset)",
    )
    NOT_A_NAME = (
        "not_a_name",
        0,
        "",
        "block",
        "DNS: the name asked is an address spelling (`2130706433`, `0x7f.1`): NXDOMAIN",
    )
    ADDRESS_RULES = (
        "address_rules",
        0,
        "",
        "allow",
        "DNS, only under the opt-in `resolve_names_for_address_rules` "
        "([policy.md](policy.md#no-lookup-decides-nothing)): no host rule decides the name, "
        "but an address rule may allow it once resolved; it is answered and each connection "
        "judged",
    )
    POOL_EXHAUSTED = (
        "pool_exhausted",
        0,
        "",
        "error",
        "DNS: the sandbox's fake-address pool is full (SERVFAIL)",
    )

    status: int
    error: str
    decision: DecisionWord
    text: str

    def __new__(
        cls, code: str, status: int, error: str, decision: DecisionWord, text: str
    ) -> Reason:
        member = str.__new__(cls, code)
        member._value_ = code
        member.status = status
        member.error = error
        member.decision = decision
        member.text = text
        return member

    @property
    def answered(self) -> bool:
        """True if the proxy answers this reason with an error response of its own."""
        return self.status != 0


class End(StrEnum):
    """How a tunnel (or an absolute-form response cut short) ended: the audit `end` field."""

    EOF = "eof", "both directions closed cleanly"
    CLIENT_CLOSED = (
        "client_closed",
        "the client ended the tunnel abruptly (a close with unread bytes is a "
        "reset; normal after a complete exchange: `curl -I`, `git clone`), or closed "
        "inside the body of a request whose head had reached the upstream (an abandoned "
        "upload: `decision: allow` with its `rule` and `bytes_up`, no `status`), or reset or "
        "closed inside a response the proxy was relaying to it",
    )
    UPSTREAM_CLOSED = (
        "upstream_closed",
        "the upstream ended the tunnel abruptly (reset, or closed without a half-close)",
    )
    LOST = "lost", "a relay failed with neither connection reported closed (not expected)"
    IDLE_TIMEOUT = "idle_timeout", "closed for inactivity (`idle_timeout`)"
    SHUTDOWN = (
        "shutdown",
        "closed after the shutdown grace period (a tunnel, or a plain-HTTP request in flight: "
        "awaiting its response, inside its body or its response's)",
    )
    HELLO_TIMEOUT = (
        "hello_timeout",
        "no complete TLS ClientHello within the head timeout (SNI check)",
    )
    RELEASED = "released", "its sandbox was released while it was open"
    REVOKED = (
        "revoked",
        "a policy change no longer allowed it while it was open: a tunnel or a plain-HTTP "
        "request in flight cut, or a kept-alive connection closed between requests "
        "([policy.md](policy.md#live-policy-changes))",
    )
    UPSTREAM_EOF = "upstream_eof", "the upstream closed inside a response body"
    UPSTREAM_LOST = "upstream_lost", "the upstream reset or vanished inside a response body"
    UPSTREAM_PROTOCOL = "upstream_protocol", "the upstream sent a malformed response body"
    RESET = "reset", "a transparent connection refused with a TCP reset"
    HEAD_TIMEOUT = "head_timeout", "no complete request head (or SOCKS5 handshake) in time"
    IDENTIFY_TIMEOUT = "identify_timeout", "not identified within `identify_timeout`"
    EVICTED = "evicted", "closed unidentified to make room for a newer connection"

    text: str

    def __new__(cls, code: str, text: str) -> End:
        member = str.__new__(cls, code)
        member._value_ = code
        member.text = text
        return member


_BY_CODE: Final[dict[str, Reason]] = {r.value: r for r in Reason}


def reason_of(code: str) -> Reason:
    """The `Reason` for an audit code (as `Decision.reason` carries it); KeyError if unknown."""
    return _BY_CODE[code]


__all__ = ["DECISIONS", "DecisionWord", "End", "Reason", "reason_of"]

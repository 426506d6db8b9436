"""What a front-end understood of its handshake (`Intent`) and how it answers (`Front`).

Pure. Every listener mode (HTTP forward, CONNECT, framework forwarder, SOCKS5, transparent,
DNS) turns its own handshake into the same `Intent` and hands it to an `Exchange`; what
differs between modes is data: a `Front` says what follows the dial and how each `Reason` is
answered in the mode's protocol (docs/architecture.md#one-exchange).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from ...policy.target import Target
from ...reasons import DecisionWord, Reason
from ..codec.tls_hello import ClientHelloResult
from .clients import Identity
from .gate import Verdict

# how an answer is written: an HTTP status line, a SOCKS5 reply code, a TCP reset, a plain
# close, a DNS rcode
Style = Literal["http", "socks5", "reset", "close", "dns"]
# what follows a dial: an HTTP request, a tunnel, or a forwarder's route (no policy); or a
# DNS query's lookup, answered from the sandbox's own fake addresses (nothing is dialed)
Shape = Literal["request", "tunnel", "route", "lookup"]

# reasons that never refuse a connection (verdicts that let it through, sandbox lifecycle
# records): every mode's table still names them, so a test can prove the tables complete
NEVER_REFUSED: Final = frozenset(
    {
        Reason.ALLOW_RULE,
        Reason.DEFAULT_ALLOW,
        Reason.FRAMEWORK_ROUTE,
        Reason.ADDRESS_RULES,
        Reason.SANDBOX_ADDED,
        Reason.SANDBOX_REPLACED,
        Reason.SANDBOX_REMOVED,
        Reason.LISTENER_PROBE,
    }
)


@dataclass(frozen=True, slots=True)
class Answer:
    """One answer in a mode's protocol: `code` is the HTTP status, SOCKS5 reply or DNS rcode."""

    style: Style
    code: int = 0


CLOSE: Final = Answer("close")
RESET: Final = Answer("reset")


@dataclass(frozen=True, slots=True)
class Front:
    """A front-end as data: what the exchange needs of a mode (`modes/kinds.py`)."""

    name: str  # http | connect | forwarder | socks5 | transparent | dns
    record_mode: str | None  # the records' `mode` field (docs/audit-log.md)
    shape: Shape
    ok: Answer | None  # the answer to a dial that worked (None: nothing is said)
    answers: Mapping[Reason, Answer]  # every `Reason`, refused or not (tests/unit)
    # the status a tunnel's record ends with (a CONNECT's `200`; a forwarder's records have
    # always said 200 too; SOCKS5 and transparent tunnels have none)
    end_status: int | None = None
    # a refusal's `decision` where the mode's records spell it otherwise than its `Reason`
    # (DNS records a closed audit log as `block`: docs/audit-log.md#dns-records)
    decisions: Mapping[Reason, DecisionWord] | None = None

    def answer(self, reason: Reason) -> Answer:
        return self.answers[reason]

    def refusal(self, verdict: Verdict, unanswerable: bool) -> Answer:
        """What a refusal is answered with in this mode's protocol: its table's answer, with
        the verdict's own status where it has one (a 505, a DNS NOTIMP); a close once the
        mode can say nothing more (`unanswerable`: its `ok` went out, or its handshake has
        not reached where its protocol answers)."""
        if unanswerable:
            return CLOSE
        answer = self.answers[verdict.reason]
        if verdict.status is not None and answer.style in ("http", "dns"):
            return Answer(answer.style, verdict.status)
        return answer

    def decision(self, reason: Reason) -> DecisionWord:
        decisions = self.decisions
        if decisions is None:
            return reason.decision
        return decisions.get(reason, reason.decision)


@dataclass(frozen=True, slots=True)
class Question:
    """A DNS query as its front-end read it: the type asked (`A`, `AAAA`...; empty before the
    question could be read) and the transport it came on (`udp`, `tcp`)."""

    qtype: str
    transport: str


@dataclass(slots=True)
class Intent:
    """One exchange as its front-end understood it, before any decision of the exchange.

    Read-only by convention, not frozen: a frozen dataclass sets each of its fields through
    `object.__setattr__`, and one is made per request (bench/profile.md).

    `target` and `identity` are the gate's own answers (`Gate.connect_target`,
    `Gate.identify`...), or None when the handshake stopped before asking: a CONNECT whose
    target does not parse is never identified; a SOCKS5 client refused at authentication
    never named a target. `host`/`port` are what the client wrote, recorded when `target`
    is a refusal.
    """

    client: str
    method: str
    scheme: str
    host: str
    port: int
    t0: int  # perf_counter_ns() when the exchange began
    target: Target | Verdict | None
    identity: Identity | Verdict | None
    cap: Verdict | None = None  # the per-client cap refused the identified client
    path: str | None = None
    explicit_port: bool = False  # the request's URL named its port (the `Host` sent on)
    orig_dst: str | None = None
    # transparent TLS reads the ClientHello before deciding (its SNI is the name)
    hello: ClientHelloResult | None = None
    hello_first: bool = False
    audit_ok: bool = True  # False: the log cannot be written (closed mode)
    # False: the handshake has not reached the point where the mode's protocol can answer
    # (a SOCKS5 client refused at authentication gets the RFC 1929 answer, no RFC 1928 reply)
    answerable: bool = True
    # refused after the verdict on the name, unless the policy refuses first: a `ws://`
    # request names a destination the policy judges before its 400 (docs/proxy.md#websocket)
    then: Verdict | None = None
    question: Question | None = None  # a DNS query's type and transport (the DNS mode)
    # the listener's HOST:PORT and mode, named in the record of a request whose target names
    # no destination (origin-form, a bad host), as a connection record names them
    # (docs/audit-log.md#connection-records)
    listener: tuple[str, str] | None = None


__all__ = [
    "CLOSE",
    "NEVER_REFUSED",
    "RESET",
    "Answer",
    "Front",
    "Intent",
    "Question",
    "Shape",
    "Style",
]

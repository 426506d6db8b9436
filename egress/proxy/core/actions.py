"""What an `Exchange` asks its driver to do next: small frozen actions, nothing else.

Pure. As h11's events do for HTTP, these name the next I/O without doing it, so one sequence
(docs/architecture.md#one-exchange) serves every front-end and every driver: the driver
carries out the action and reports back with the exchange's matching method.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from ...policy.target import IPAddress
from .gate import Verdict
from .intent import Answer
from .record import AccessRecord


@dataclass(frozen=True, slots=True)
class Done:
    """The exchange ended: emit `record` with this outcome (the audit line's last fields)."""

    record: AccessRecord
    decision: str
    reason: str
    rule: str | None
    detail: str | None
    status: int | None


@dataclass(frozen=True, slots=True)
class Refuse:
    """Answer `answer` in the front-end's protocol (nothing once the tunnel's `ReplyOk` went
    out: `answer.style` is then `close`), close, then emit `done`."""

    verdict: Verdict
    answer: Answer
    done: Done


@dataclass(frozen=True, slots=True)
class Resolve:
    """Resolve `host`; report `resolved(addrs)` or `resolve_failed(err)`."""

    host: str


@dataclass(frozen=True, slots=True)
class Dial:
    """Connect to the first reachable of `addrs` on `port` (`pooled`: a kept-alive upstream
    may serve it); report `dialed(addr)` or `dial_failed(err, addr)`."""

    addrs: tuple[IPAddress, ...]
    port: int
    pooled: bool


@dataclass(frozen=True, slots=True)
class ReplyOk:
    """Tell the client the tunnel is open (`answer`: `200`, SOCKS `0x00`); report `replied()`."""

    answer: Answer


@dataclass(frozen=True, slots=True)
class ReadHello:
    """Read the tunnel's first bytes as a TLS ClientHello; report `hello(result)`."""


@dataclass(frozen=True, slots=True)
class Relay:
    """Relay: a tunnel's bytes both ways, or a request (`request`): send its head and report
    `sent()`, relay its body and read its response (`core/reader.ResponseReader` reports
    `response(status)` for each head); `ended(...)` at the end."""

    request: bool


# the argument-less actions, made once (an exchange returns them on every request)
READ_HELLO: Final = ReadHello()
RELAY_REQUEST: Final = Relay(request=True)
RELAY_TUNNEL: Final = Relay(request=False)

Action = Refuse | Resolve | Dial | ReplyOk | ReadHello | Relay | Done

__all__ = [
    "READ_HELLO",
    "RELAY_REQUEST",
    "RELAY_TUNNEL",
    "Action",
    "Dial",
    "Done",
    "ReadHello",
    "Refuse",
    "Relay",
    "ReplyOk",
    "Resolve",
]

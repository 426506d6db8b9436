"""The legal sequence of an exchange's events, as data (h11's `_state.py` in small).

Pure. An `Exchange` (`exchange.py`) waits for one of a few events in each `State`; which
event may come in which state, and which states it may lead to, is the `TRANSITIONS`
table, checked on every event, so a driver that reports an event out of turn is a bug
caught at once (`SequenceError`), never a silent misrecord
(docs/architecture.md#one-exchange).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Final


class SequenceError(Exception):
    """A driver called an event the exchange's state does not allow: a bug in the driver."""


class State(StrEnum):
    """Where an exchange is: what it waits for next (a `StrEnum`: its members hash in C,
    and the table is consulted on every event)."""

    IDLE = "idle"  # nothing yet: `start`
    RESOLVING = "resolving"  # `resolved` or `resolve_failed`
    DIALING = "dialing"  # `dialed` or `dial_failed`
    REPLYING = "replying"  # the `ReplyOk` is being written: `replied`
    HELLO = "hello"  # the ClientHello is being read: `hello`
    SENDING = "sending"  # a request's head is being sent upstream: `sent`
    AWAITING = "awaiting"  # its response heads are being read: `response`, `retry`
    RELAYING = "relaying"  # a tunnel's bytes or a final response's body: `ended`
    DONE = "done"


_S = State
# methods a request may be sent again with when its pooled upstream closed before answering
# (RFC 9110 section 9.2.2; `Exchange.retry`)
IDEMPOTENT: Final = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
_ANY: Final = frozenset(s for s in State if s is not State.DONE)
# event -> {state it may come in: the states it may lead to}; anything else is a bug
# in a driver (SequenceError), never a silent misrecord
TRANSITIONS: Final[Mapping[str, Mapping[State, frozenset[State]]]] = {
    "start": {_S.IDLE: frozenset({_S.RESOLVING, _S.DIALING, _S.DONE})},
    "start_kept": {_S.IDLE: frozenset({_S.DIALING})},
    "resolved": {_S.RESOLVING: frozenset({_S.DIALING, _S.DONE})},
    "resolve_failed": {_S.RESOLVING: frozenset({_S.DONE})},
    "dialed": {_S.DIALING: frozenset({_S.REPLYING, _S.SENDING, _S.RELAYING})},
    "dial_failed": {_S.DIALING: frozenset({_S.DONE})},
    "replied": {_S.REPLYING: frozenset({_S.HELLO, _S.RELAYING})},
    "hello": {_S.HELLO: frozenset({_S.RELAYING, _S.DONE})},
    "sent": {_S.SENDING: frozenset({_S.AWAITING})},
    # a 1xx: read on; the final head: its body; a 101: refused
    "response": {_S.AWAITING: frozenset({_S.AWAITING, _S.RELAYING, _S.DONE})},
    "retry": {_S.AWAITING: frozenset({_S.SENDING})},  # sent again on a fresh upstream
    # (a request ends before its response when the proxy cuts it, or its client goes away)
    "ended": dict.fromkeys((_S.SENDING, _S.AWAITING, _S.RELAYING), frozenset({_S.DONE})),
    "refuse": dict.fromkeys(_ANY, frozenset({_S.DONE})),
}


__all__ = ["IDEMPOTENT", "TRANSITIONS", "SequenceError", "State"]

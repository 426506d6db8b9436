"""Playbooks for the exchange (mitmproxy's `tutils.Playbook` style): events in, actions out.

`Playbook(exchange) >> ev.start(intent) << Resolve("x.test") >> ev.resolved(...) << ...`
plays the events on a pure `Exchange` and checks that each produced the expected action, in
order; `Refused` and `Ended` match a refusal or an end by what matters (reason, answer,
status) rather than by the whole record. No sockets, no loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from egress.proxy.core.actions import Done, Refuse
from egress.proxy.core.exchange import Exchange
from egress.proxy.core.intent import Answer
from egress.reasons import Reason


@dataclass(frozen=True)
class Refused:
    """Expect a `Refuse` action with this reason, answer, and record outcome."""

    reason: Reason
    answer: Answer
    status: int | None = None

    def matches(self, action: object) -> bool:
        return (
            isinstance(action, Refuse)
            and action.verdict.reason is self.reason
            and action.answer == self.answer
            and action.done.reason == self.reason.value
            and action.done.status == self.status
        )


@dataclass(frozen=True)
class Ended:
    """Expect a `Done` action: an admitted exchange that ended."""

    reason: Reason
    status: int | None

    def matches(self, action: object) -> bool:
        return (
            isinstance(action, Done)
            and action.decision == "allow"
            and action.reason == self.reason.value
            and action.status == self.status
        )


class Playbook:
    """`Playbook(exchange) >> event << expected action >> event << ...`, true if every event
    produced its expected action in order (like mitmproxy's `tutils.Playbook`)."""

    def __init__(self, exchange: Exchange) -> None:
        self.exchange = exchange
        self.script: list[tuple[str, tuple[object, ...]] | object] = []
        self.actions: list[object] = []

    def __rshift__(self, event: tuple[str, tuple[object, ...]]) -> Playbook:
        self.script.append(("event", event))
        return self

    def __lshift__(self, expected: object) -> Playbook:
        self.script.append(("expect", expected))
        return self

    def __bool__(self) -> bool:
        pending: list[object] = []
        for kind, item in self.script:  # type: ignore[misc]
            if kind == "event":
                name, args = item
                action = getattr(self.exchange, name)(*args)
                self.actions.append(action)
                pending.append(action)
            else:
                assert pending, f"expected {item!r} but no event produced an action"
                got = pending.pop(0)
                ok = item.matches(got) if hasattr(item, "matches") else got == item
                assert ok, f"expected {item!r}, got {got!r}"
        assert not pending, f"unexpected actions {pending!r}"
        return True


class _Events:
    def __getattr__(self, name: str) -> Callable[..., tuple[str, tuple[object, ...]]]:
        return lambda *args: (name, args)


ev = _Events()


def done_of(book: Playbook) -> Done:
    last = book.actions[-1]
    return last.done if isinstance(last, Refuse) else last  # type: ignore[return-value]

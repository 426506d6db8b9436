"""Refusal floods: at most one record per client, listener and reason per second.

Pure (callers pass loop time). Why (docs/audit-log.md#aggregated-refusals): a sandbox that
hoards connections is refused thousands of times a second, and one line per refusal once
wrote 113 MB in 48 s, drowning every other record. The first refusal of a window is recorded
at once; the rest of that window are counted and written as one record carrying `count` (the
number of refusals it stands for) when the window ends.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

P = TypeVar("P")

WINDOW = 1.0  # seconds
# refusals of one key answered in full in one window (an HTTP 503, a lingering close); the
# rest of that window are closed at once with a reset (docs/audit-log.md#aggregated-refusals)
ANSWERED = 32


class _Open(Generic[P]):
    __slots__ = ("count", "last", "start", "written")

    def __init__(self, start: float, last: P) -> None:
        self.start = start
        self.count = 0  # refusals counted, not yet written
        self.last = last
        self.written = 1  # refusals of the window written at once (the first `burst`)


class Tally(Generic[P]):
    """Windows of refusals by key; `add` and `due` say what to write, with counts."""

    __slots__ = ("_open", "burst", "window")

    def __init__(self, window: float = WINDOW, burst: int = 1) -> None:
        self.window = window
        self.burst = burst  # refusals of a key written one by one at the start of a window
        self._open: dict[Hashable, _Open[P]] = {}

    def add(self, key: Hashable, payload: P, now: float) -> list[tuple[P, int]]:
        """A refusal: the records to write now, each (payload, how many it stands for)."""
        entry = self._open.get(key)
        out: list[tuple[P, int]] = []
        if entry is not None and now - entry.start >= self.window:
            if entry.count:
                out.append((entry.last, entry.count))
            entry = None
        if entry is None:
            self._open[key] = _Open(now, payload)
            out.append((payload, 1))
        elif entry.written < self.burst and not entry.count:
            entry.written += 1
            out.append((payload, 1))
        else:
            entry.count += 1
            entry.last = payload
        return out

    def seen(self, key: Hashable, now: float) -> int:
        """Refusals of `key` in its window open at `now` (0: none, or the window ended)."""
        entry = self._open.get(key)
        if entry is None or now - entry.start >= self.window:
            return 0
        return entry.count + entry.written

    def due(self, now: float, *, everything: bool = False) -> list[tuple[P, int]]:
        """Counted refusals whose window has ended (all of them with `everything`)."""
        out: list[tuple[P, int]] = []
        for key, entry in list(self._open.items()):
            if everything or now - entry.start >= self.window:
                if entry.count:
                    out.append((entry.last, entry.count))
                del self._open[key]
        return out


def answer_in_full(seen: int) -> bool:
    """Whether a refusal is answered (503, lingering close) or only closed with a reset:
    a flood's first `ANSWERED` refusals in a window are, so a client over its cap by
    mistake sees why; past that the answer would only feed the flood (each refusal is
    still counted in the window's record)."""
    return seen < ANSWERED


__all__ = ["ANSWERED", "WINDOW", "Tally", "answer_in_full"]

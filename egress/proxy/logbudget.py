"""The audit log's byte budget per client: what one sandbox's refusals may write per second.

Pure (callers pass loop time and sizes). Why (docs/audit-log.md#the-budget-per-sandbox): a
refusal costs the sandbox one request and the proxy a few microseconds, so refusals are the
cheapest way to fill the audit disk; one sandbox once wrote ~88 MB/s of 403 records and
filled an 8 MiB disk in 0.11 s, after which every sandbox was refused (closed mode) or lost
records (open mode). Refusals are first aggregated (`tally.py`), then each client's refusal
records may take `PER_SECOND` bytes of log per one-second window; the records past that are
not written, but counted, and one `suppressed` record per client and window says how many
records and refusals were left out, of which reasons, and how many bytes they would have
taken. Records of exchanges that reached an upstream are never held back.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Final

PER_SECOND: Final = 32768  # bytes of refusal records per client per window
WINDOW: Final = 1.0  # seconds


class Suppressed:
    """What one client's window left out: the `suppressed` record's fields."""

    __slots__ = ("bytes", "client", "client_id", "reasons", "records", "refusals", "start")

    def __init__(self, start: float, client: str, client_id: str | None) -> None:
        self.start = start
        self.client = client  # the last left-out record's client (ip:port)
        self.client_id = client_id
        self.records = 0  # records not written
        self.refusals = 0  # refusals they stood for (an aggregated record counts its `count`)
        self.bytes = 0  # their size as serialized
        self.reasons: dict[str, int] = {}  # refusals by reason

    def event(self, window: float) -> dict[str, object]:
        return {
            "type": "suppressed",
            "client": self.client,
            "client_id": self.client_id,
            "records": self.records,
            "refusals": self.refusals,
            "bytes": self.bytes,
            "reasons": dict(sorted(self.reasons.items())),
            "window_s": window,
            "budget": PER_SECOND,
        }


class _Window:
    __slots__ = ("left_out", "start", "used")

    def __init__(self, start: float) -> None:
        self.start = start
        self.used = 0
        self.left_out: Suppressed | None = None


class LogBudget:
    """Byte budgets of refusal records by client; `take` says whether a record is written."""

    __slots__ = ("_windows", "per_second", "window")

    def __init__(self, per_second: int = PER_SECOND, window: float = WINDOW) -> None:
        self.per_second = per_second
        self.window = window
        self._windows: dict[Hashable, _Window] = {}

    def take(
        self,
        key: Hashable,
        size: int,
        now: float,
        *,
        count: int,
        reason: str,
        client: str,
        client_id: str | None,
    ) -> tuple[bool, list[Suppressed]]:
        """A refusal record of `size` bytes standing for `count` refusals: whether to write
        it, and the `suppressed` records of ended windows to write first."""
        out: list[Suppressed] = []
        entry = self._windows.get(key)
        if entry is not None and now - entry.start >= self.window:
            if entry.left_out is not None:
                out.append(entry.left_out)
            entry = None
        if entry is None:
            entry = self._windows[key] = _Window(now)
        if entry.used + size <= self.per_second:
            entry.used += size
            return True, out
        left = entry.left_out
        if left is None:
            left = entry.left_out = Suppressed(entry.start, client, client_id)
        left.client = client
        left.records += 1
        left.refusals += count
        left.bytes += size
        left.reasons[reason] = left.reasons.get(reason, 0) + count
        return False, out

    def due(self, now: float, *, everything: bool = False) -> list[Suppressed]:
        """The `suppressed` records of windows that have ended (all with `everything`);
        ended windows are forgotten, so memory holds only the clients of the last second."""
        out: list[Suppressed] = []
        for key, entry in list(self._windows.items()):
            if everything or now - entry.start >= self.window:
                if entry.left_out is not None:
                    out.append(entry.left_out)
                del self._windows[key]
        return out


__all__ = ["PER_SECOND", "WINDOW", "LogBudget", "Suppressed"]

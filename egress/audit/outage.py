"""An outage of the audit log: from the write that failed to the one that worked again
(docs/audit-log.md#when-the-log-cannot-be-written).

Strategy: the writer thread marks the outage's place in the chain with an `outage` record,
counts what it took from the queue meanwhile (and how many of those lines were
`audit_unavailable` refusals), and ends it with a `recovered` record whose counts are the
differences since it began. Owned by the writer thread: no lock.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Outage:
    """The outage in progress; `since` is 0.0 when there is none."""

    since: float = 0.0  # time.monotonic() when it began
    lines: int = 0  # lines taken from the queue while unwritable
    refused: int = 0  # ... of which audit_unavailable refusals
    errors: int = 0  # write_errors when it began
    dropped: int = 0  # lines_dropped when it began

    def begin(self, now: float, write_errors: int, lines_dropped: int) -> None:
        """The write that failed was the `write_errors`-th (counted before it)."""
        self.since = now
        self.lines = self.refused = 0
        self.errors, self.dropped = write_errors, lines_dropped

    def count(self, body: str, head: str) -> None:
        """A line taken from the queue while unwritable; `head` is its first 64 characters."""
        self.lines += 1
        if '"audit_unavailable"' in body and '"type":"' not in head:  # its `count`: how many
            at = body.find('"count":')
            end = body.find(",", at) if at >= 0 else -1
            count = body[at + 8 : end] if end > 0 else ""
            self.refused += int(count) if count.isdigit() else 1

    def recovered(self, now: float, write_errors: int, lines_dropped: int) -> dict[str, object]:
        """The `recovered` record's counts (without `type` and `run`), and the outage ends."""
        fields: dict[str, object] = {
            "outage_ms": round((now - self.since) * 1000),
            "write_errors": write_errors - self.errors,
            "lines": self.lines,
            "refused": self.refused,
            "lost": lines_dropped - self.dropped,
        }
        self.since = 0.0
        return fields


__all__ = ["Outage"]

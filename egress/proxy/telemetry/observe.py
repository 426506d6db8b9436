"""Who else sees an access record: metrics, per-execution summaries, `on_decision` callbacks.

Strategy (docs/metrics.md): the server calls `Observers.record(event)` right after it hands
the same record to the audit log, so metrics, summaries and callbacks all count exactly the
records the audit log has. Metrics and summaries read the record as is (O(1) dict work);
callbacks get a redacted copy (secret-named fields dropped, query strings redacted — the
same `Redactor` the audit log uses), made only when a callback is registered. A callback
that raises is logged and counted in `callback_errors`; it never reaches the proxy.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ...audit.redact import Redactor
from .metrics import ProxyMetrics

log = logging.getLogger("egress")

DecisionCallback = Callable[[dict[str, object]], object]


MAX_SUMMARY_HOSTS = 1000  # hosts one summary keeps by name (docs/proxy.md#per-sandbox-bounds)


@dataclass
class ExecutionSummary:
    """What one execution (one client id) did, counted from its access records.

    `by_decision` {"allow": 12, "block": 3}; `by_reason` {"allow_rule": 12, "block_rule": 3};
    `by_host` {"pypi.org": {"allow": 12}, "evil.example": {"block": 3}}. `blocked_hosts`
    lists the hosts with at least one refusal (decision other than allow), sorted.

    Bounded (docs/proxy.md#per-sandbox-bounds): an agent chooses its hosts, and 180k distinct
    names once took a proxy from 74 to 205 MB. `by_host` keeps the top `max_hosts` hosts by
    name: when it holds twice that many, it keeps the `max_hosts` with a refusal first, then
    the most records, and folds the rest into `other_hosts` (how many host entries were
    folded) and `other` (their records by decision). Totals (`total`, `by_decision`,
    `by_reason`) are always exact.
    """

    client_id: str
    total: int = 0
    by_decision: dict[str, int] = field(default_factory=dict)
    by_reason: dict[str, int] = field(default_factory=dict)
    by_host: dict[str, dict[str, int]] = field(default_factory=dict)
    other_hosts: int = 0
    other: dict[str, int] = field(default_factory=dict)
    max_hosts: int = MAX_SUMMARY_HOSTS

    def add(self, event: dict[str, object]) -> None:
        decision = str(event["decision"])
        reason = str(event["reason"])
        host = str(event.get("host") or "")
        self.total += 1
        self.by_decision[decision] = self.by_decision.get(decision, 0) + 1
        self.by_reason[reason] = self.by_reason.get(reason, 0) + 1
        per_host = self.by_host.get(host)
        if per_host is None:
            if len(self.by_host) >= 2 * self.max_hosts:
                self.trim()
            per_host = self.by_host[host] = {}
        per_host[decision] = per_host.get(decision, 0) + 1

    def trim(self) -> None:
        """Keep the top `max_hosts` hosts (refused ones first, then by records); fold the
        rest into `other_hosts` and `other`. Amortized O(log n) per new host."""
        if len(self.by_host) <= self.max_hosts:
            return

        def rank(item: tuple[str, dict[str, int]]) -> tuple[bool, int]:
            counts = item[1]
            return (bool(set(counts) - {"allow"}), sum(counts.values()))

        ranked = sorted(self.by_host.items(), key=rank, reverse=True)
        for _, counts in ranked[self.max_hosts :]:
            self.other_hosts += 1
            for decision, n in counts.items():
                self.other[decision] = self.other.get(decision, 0) + n
        self.by_host = dict(ranked[: self.max_hosts])

    @property
    def blocked_hosts(self) -> list[str]:
        return sorted(h for h, d in self.by_host.items() if set(d) - {"allow"})


class Observers:
    """Fan-out of access records to metrics, tracked executions and callbacks."""

    def __init__(
        self, metrics: ProxyMetrics | None, callbacks: Iterable[DecisionCallback] = ()
    ) -> None:
        self.metrics = metrics
        self.callbacks: list[DecisionCallback] = list(callbacks)
        self.summaries: dict[str, ExecutionSummary] = {}
        self.callback_errors = 0
        self._redactor = Redactor(keep_query=False)
        self._tasks: set[asyncio.Future[object]] = set()

    def record(self, event: dict[str, object]) -> None:
        """Called once per access record, after the audit log got it (the metrics are fed
        by the server directly, `Steps.emit`)."""
        if self.summaries:
            summary = self.summaries.get(event.get("client_id"))  # type: ignore[call-overload]
            if summary is not None:
                summary.add(event)
        if self.callbacks:
            self._call(event)

    def _call(self, event: dict[str, object]) -> None:
        rec = dict(event)
        self._redactor.redact(rec)
        for callback in self.callbacks:
            try:
                result = callback(rec)
                if inspect.isawaitable(result):
                    task = asyncio.ensure_future(result)
                    self._tasks.add(task)
                    task.add_done_callback(self._task_done)
            except Exception:
                self._failed(callback)

    def _task_done(self, task: asyncio.Future[object]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.callback_errors += 1
            log.error("egress: on_decision callback failed", exc_info=task.exception())

    def _failed(self, callback: DecisionCallback) -> None:
        self.callback_errors += 1
        log.exception("egress: on_decision callback %r raised (contained)", callback)

    # -- executions ---------------------------------------------------------------------------
    def track(self, client_id: str) -> ExecutionSummary:
        """Start (or restart) counting the records of `client_id`."""
        summary = self.summaries[client_id] = ExecutionSummary(client_id)
        return summary

    def untrack(self, client_id: str) -> ExecutionSummary:
        """Stop counting `client_id`; its summary so far (empty if it was never tracked)."""
        summary = self.summaries.pop(client_id, None) or ExecutionSummary(client_id)
        summary.trim()  # handed out with at most `max_hosts` hosts
        return summary


__all__ = ["DecisionCallback", "ExecutionSummary", "Observers"]

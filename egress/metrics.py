"""Counters, gauges and histograms of a running proxy, derived from its access records.

Strategy (docs/metrics.md): the proxy produces exactly one access record per request, tunnel
or refusal, and hands the same dict to the audit log and to `ProxyMetrics.record`. Counting
here rather than next to each branch of the server makes "the counts equal the audit log"
hold by construction. The hot path is O(1) dict and int work: no locks, no label objects,
no string formatting; the Prometheus text is only built when /metrics is scraped (see
`egress.admin`). Gauges (open connections, open tunnels) are read at scrape time or moved by
two increments in the server. This module is pure: no I/O, no event loop.

Bounds: label sets are (client_id, decision, reason) and (client_id,); reasons are a closed
set of constants and client ids are those the operator configured (plus `-` for none), so
the tables cannot grow with traffic. A guard (`MAX_SERIES`) folds anything beyond into one
`other` series in case a future reason were made of request data.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

# Bucket bounds in seconds: 100 us .. 30 s covers a cached decision up to a connect timeout.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
MAX_SERIES = 4096  # per table; see the module docstring
NO_CLIENT = "-"  # label value for records without a client_id (top-level policy)


@dataclass(slots=True)
class Histogram:
    """Cumulative-at-read histogram: one bucket index and two adds per observation."""

    bounds: tuple[float, ...] = LATENCY_BUCKETS
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.total += seconds
        self.count += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, cumulative count) pairs ending with (inf, count)."""
        out: list[tuple[float, int]] = []
        running = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out


class ProxyMetrics:
    """The proxy's numbers. `record(event)` is called once per access record.

    `open_connections` is a callable the server supplies (the size of its connection set),
    so that gauge costs nothing per connection.
    """

    def __init__(self, open_connections: Callable[[], int] = lambda: 0) -> None:
        self.requests: dict[tuple[str, str, str], int] = {}
        self.bytes_up: dict[str, int] = {}
        self.bytes_down: dict[str, int] = {}
        self.open_tunnels = 0
        self.open_connections = open_connections
        self.decision = Histogram()
        self.dns = Histogram()
        self.connect = Histogram()
        self.request = Histogram()

    # -- the hot path ---------------------------------------------------------------------
    def record(self, event: dict[str, object]) -> None:
        """Count one access record (the dict the audit log gets, before it is written)."""
        client = event.get("client_id") or NO_CLIENT
        key = (client, event["decision"], event["reason"])
        requests = self.requests
        n = requests.get(key)  # type: ignore[arg-type]
        if n is None:
            if len(requests) >= MAX_SERIES:
                key = (NO_CLIENT, "other", "other")
                n = requests.get(key, 0)
            else:
                n = 0
        requests[key] = n + 1  # type: ignore[index]
        up = event.get("bytes_up")
        if up is not None:
            self._add(self.bytes_up, client, up)  # type: ignore[arg-type]
            self._add(self.bytes_down, client, event.get("bytes_down") or 0)  # type: ignore[arg-type]
        ms = event.get("duration_ms")
        if ms is not None:
            self.request.observe(ms / 1000.0)  # type: ignore[operator]

    @staticmethod
    def _add(table: dict[str, int], client: str, n: int) -> None:
        if client not in table and len(table) >= MAX_SERIES:
            client = "other"
        table[client] = table.get(client, 0) + n

    # -- reading ----------------------------------------------------------------------------
    def snapshot(self) -> dict[str, object]:
        """A plain-data copy for in-process use (`EgressProxy.metrics()`), documented in
        docs/metrics.md#in-process."""
        return {
            "requests": [
                {"client_id": c, "decision": d, "reason": r, "count": n}
                for (c, d, r), n in sorted(self.requests.items())
            ],
            "bytes_up": dict(self.bytes_up),
            "bytes_down": dict(self.bytes_down),
            "open_connections": self.open_connections(),
            "open_tunnels": self.open_tunnels,
            "latency": {name: _hist_dict(h) for name, h in self.histograms()},
        }

    def histograms(self) -> Iterator[tuple[str, Histogram]]:
        yield "decision", self.decision
        yield "dns", self.dns
        yield "connect", self.connect
        yield "request", self.request

    def count(self, *, client_id: str | None = None, decision: str | None = None,
              reason: str | None = None) -> int:  # fmt: skip
        """Sum of the request counter over the series matching the given labels."""
        want_client = None if client_id is None else client_id or NO_CLIENT
        return sum(
            n for (c, d, r), n in self.requests.items()
            if (want_client is None or c == want_client) and (decision is None or d == decision)
            and (reason is None or r == reason)
        )  # fmt: skip


def _hist_dict(h: Histogram) -> dict[str, object]:
    return {"count": h.count, "sum": h.total, "buckets": h.cumulative()}


__all__ = ["LATENCY_BUCKETS", "Histogram", "ProxyMetrics"]

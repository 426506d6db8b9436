"""Counters, gauges and histograms of a running proxy, derived from its access records.

Strategy (docs/metrics.md): the proxy produces exactly one access record per request, tunnel
or refusal, and hands the same dict to the audit log and to `ProxyMetrics.record`. Counting
here rather than next to each branch of the server makes "the counts equal the audit log"
hold by construction. The hot path is O(1) dict and int work: no locks, no label objects,
no string formatting; the Prometheus text is only built when /metrics is scraped (see
`egress.admin`). Gauges (open connections, open tunnels) are read at scrape time or moved by
two increments in the server.

Pure: no I/O, no event loop.

Bounds: label sets are (client_id, decision, reason) and (client_id,); reasons are a closed
set of constants and client ids are those the operator configured (plus `-` for none), so
the tables cannot grow with traffic. A guard (`MAX_SERIES`) folds anything beyond into one
`other` series in case a future reason were made of request data.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from operator import itemgetter

# Bucket bounds in seconds: 100 us .. 30 s covers a cached decision up to a connect timeout.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
MAX_SERIES = 4096  # per table; see the module docstring
NO_CLIENT = "-"  # label value for records without a client_id (top-level policy)


FOLD_AT = 1024  # raw observations kept before they are folded into buckets


class Histogram:
    """A latency histogram whose hot path is one `list.append`.

    Observations are kept raw and folded into the buckets in batches of `FOLD_AT` (one C
    sort and one bisection per bound), and before any read: per observation that is a few
    tens of nanoseconds instead of a Python-level bucket search.
    """

    __slots__ = ("_raw", "bounds", "count", "counts", "observe", "scale", "total")

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS, scale: float = 1.0) -> None:
        self.bounds = bounds
        self.scale = scale  # observations are in seconds * scale (1000: milliseconds)
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.total = 0.0
        self.count = 0
        self._raw: list[float] = []
        self.observe = self._observe  # rebound per instance: one attribute load on the hot path

    def _observe(self, seconds: float) -> None:
        raw = self._raw
        raw.append(seconds)
        if len(raw) >= FOLD_AT:
            self.fold()

    def extend(self, values: Iterable[float]) -> None:
        raw = self._raw
        raw.extend(values)
        if len(raw) >= FOLD_AT:
            self.fold()

    def fold(self) -> None:
        """Move the raw observations into the buckets."""
        raw = self._raw
        if not raw:
            return
        raw.sort()
        below = 0
        for i, bound in enumerate(self.bounds):
            upto = bisect_right(raw, bound * self.scale, below)  # le: the bound is inside
            self.counts[i] += upto - below
            below = upto
        self.counts[-1] += len(raw) - below
        self.total += sum(raw) / self.scale
        self.count += len(raw)
        raw.clear()

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, cumulative count) pairs ending with (inf, count)."""
        self.fold()
        out: list[tuple[float, int]] = []
        running = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out


# One pending record: (client_id, decision, reason, bytes_up, bytes_down, duration_ms).
# A tuple of plain values, not the event dict: the garbage collector stops tracking it, and
# nothing the audit log or a callback holds is kept alive by the batch.
Pending = tuple[str | None, str, str, int | None, int | None, float | None]
_KEY = itemgetter(0, 1, 2)
BATCH = 256  # records held before they are counted (each read counts them first)


class ProxyMetrics:
    """The proxy's numbers, counted from the access records.

    The server appends one `Pending` tuple per record to `pending` (`Steps.emit`; `record`
    does the same from an event dict); `fold` counts a batch at a time with C-level
    `map`/`Counter.update` and one short loop for the byte counters, and every read folds
    first, so what is read is always complete. `open_connections` is a callable the server
    supplies (the size of its connection set), so that gauge costs nothing per connection.
    """

    def __init__(self, open_connections: Callable[[], int] = lambda: 0) -> None:
        # keyed by the record's own values (client_id None included): no work to label them
        self.requests: Counter[tuple[str | None, str, str]] = Counter()
        self.bytes_up: dict[str | None, int] = {}
        self.bytes_down: dict[str | None, int] = {}
        # DNS records (transparent mode's responder): counted apart, so request counters stay
        # one per request while requests + dns_queries equal the audit log's records
        self.dns_queries: Counter[tuple[str | None, str, str]] = Counter()
        self.open_tunnels = 0
        self.open_connections = open_connections
        self.decision = Histogram()
        self.dns = Histogram()
        self.connect = Histogram()
        self.request = Histogram(scale=1000.0)  # fed the records' duration_ms
        self.pending: list[Pending] = []

    # -- the hot path ---------------------------------------------------------------------
    def record(self, event: dict[str, object]) -> None:
        """Count one access record (the dict the audit log gets)."""
        pending = self.pending
        pending.append(
            (
                event.get("client_id"),
                event["decision"],
                event["reason"],  # type: ignore[arg-type]
                event.get("bytes_up"),
                event.get("bytes_down"),
                event.get("duration_ms"),
            )
        )
        if len(pending) >= BATCH:
            self.fold()

    def record_dns(self, event: dict[str, object]) -> None:
        """Count one DNS record (docs/audit-log.md#dns-records); off the request hot path."""
        key = (event.get("client_id"), str(event["decision"]), str(event["reason"]))
        table = self.dns_queries
        if key not in table and len(table) >= MAX_SERIES:
            key = ("other", key[1], key[2])  # bounded like the request table
        table[key] += 1  # type: ignore[index]

    def fold(self) -> None:
        """Count the pending records."""
        batch = self.pending
        if not batch:
            return
        self.requests.update(map(_KEY, batch))
        up_t, down_t = self.bytes_up, self.bytes_down
        for client, _, _, up, down, _ in batch:
            if up is not None:
                up_t[client] = up_t.get(client, 0) + up
                down_t[client] = down_t.get(client, 0) + (down or 0)
        self.request.extend([p[5] for p in batch if p[5] is not None])
        batch.clear()
        if len(self.requests) > MAX_SERIES or len(up_t) > MAX_SERIES:
            self._fold_overflow()

    def _fold_overflow(self) -> None:
        """Bound the tables (module docstring): fold the excess into `other` series."""
        requests = self.requests
        while len(requests) > MAX_SERIES:
            key = next(k for k in requests if k[0] != "other")
            requests[("other", key[1], key[2])] += requests.pop(key)
        for table in (self.bytes_up, self.bytes_down):
            while len(table) > MAX_SERIES:
                client = next(k for k in table if k != "other")
                table["other"] = table.get("other", 0) + table.pop(client)

    # -- reading ----------------------------------------------------------------------------
    def request_series(self) -> list[tuple[str, str, str, int]]:
        """(client, decision, reason, count), client `-` for records without a client_id."""
        self.fold()
        return sorted((c or NO_CLIENT, d, r, n) for (c, d, r), n in self.requests.items())

    def dns_series(self) -> list[tuple[str, str, str, int]]:
        """(client, decision, reason, count) of the DNS records."""
        return sorted((c or NO_CLIENT, d, r, n) for (c, d, r), n in self.dns_queries.items())

    def byte_series(self) -> tuple[dict[str, int], dict[str, int]]:
        """Bytes up and down by client label."""
        self.fold()
        up = {c or NO_CLIENT: n for c, n in list(self.bytes_up.items())}
        down = {c or NO_CLIENT: n for c, n in list(self.bytes_down.items())}
        return up, down

    def snapshot(self) -> dict[str, object]:
        """A plain-data copy for in-process use (`EgressProxy.metrics()`), documented in
        docs/metrics.md#in-process."""
        up, down = self.byte_series()
        return {
            "requests": [
                {"client_id": c, "decision": d, "reason": r, "count": n}
                for c, d, r, n in self.request_series()
            ],
            "dns_queries": [
                {"client_id": c, "decision": d, "reason": r, "count": n}
                for c, d, r, n in self.dns_series()
            ],
            "bytes_up": up,
            "bytes_down": down,
            "open_connections": self.open_connections(),
            "open_tunnels": self.open_tunnels,
            "latency": {name: _hist_dict(h) for name, h in self.histograms()},
        }

    def histograms(self) -> Iterator[tuple[str, Histogram]]:
        self.fold()
        yield "decision", self.decision
        yield "dns", self.dns
        yield "connect", self.connect
        yield "request", self.request

    def count(
        self,
        *,
        client_id: str | None = None,
        decision: str | None = None,
        reason: str | None = None,
    ) -> int:
        """Sum of the request counter over the series matching the given labels."""
        want_client = None if client_id is None else client_id or NO_CLIENT
        return sum(
            n
            for c, d, r, n in self.request_series()
            if (want_client is None or c == want_client)
            and (decision is None or d == decision)
            and (reason is None or r == reason)
        )


def _hist_dict(h: Histogram) -> dict[str, object]:
    buckets = h.cumulative()
    return {"count": h.count, "sum": h.total, "buckets": buckets}


__all__ = ["LATENCY_BUCKETS", "Histogram", "ProxyMetrics"]

"""ProxyMetrics and the histogram (pure): batched counting equals counting one by one."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from egress.audit.suggest import exact_rule
from egress.proxy.telemetry.metrics import (
    BATCH,
    LATENCY_BUCKETS,
    MAX_SERIES,
    Histogram,
    ProxyMetrics,
)

events = st.fixed_dictionaries(
    {
        "decision": st.sampled_from(["allow", "block", "error"]),
        "reason": st.sampled_from(["allow_rule", "default_deny", "dns_error"]),
    },
    optional={
        "client_id": st.sampled_from(["a", "b"]),
        "bytes_up": st.integers(0, 10**6),
        "bytes_down": st.integers(0, 10**6),
        "duration_ms": st.floats(0, 60_000),
    },
)


@given(st.lists(events, max_size=3 * BATCH))
def test_batched_counts_equal_naive_counts(batch: list[dict[str, object]]) -> None:
    m = ProxyMetrics()
    for event in batch:
        m.record(event)
    want = Counter((e.get("client_id") or "-", e["decision"], e["reason"]) for e in batch)
    got = {(c, d, r): n for c, d, r, n in m.request_series()}
    assert got == dict(want)
    up, down = m.byte_series()
    for client in ("a", "b", "-"):
        mine = [e for e in batch if (e.get("client_id") or "-") == client and "bytes_up" in e]
        assert up.get(client, 0) == sum(int(e["bytes_up"]) for e in mine)  # type: ignore[call-overload]
        assert down.get(client, 0) == sum(int(e.get("bytes_down", 0)) for e in mine)  # type: ignore[call-overload]
    timed = [e["duration_ms"] for e in batch if "duration_ms" in e]
    assert m.request.cumulative()[-1] == (float("inf"), len(timed))


@given(st.lists(st.floats(0, 100), max_size=3000))
def test_histogram_buckets_equal_a_scan(values: list[float]) -> None:
    h = Histogram()
    for v in values:
        h.observe(v)
    for bound, n in h.cumulative():
        assert n == sum(1 for v in values if v <= bound)
    assert h.count == len(values)


def test_histogram_edges_and_scale() -> None:
    h = Histogram(scale=1000.0)
    h.extend([0.1, 0.10000001, 30_000.0, 30_001.0])  # milliseconds
    buckets = dict(h.cumulative())
    assert buckets[LATENCY_BUCKETS[0]] == 1  # 0.1 ms is inside the 100 us bucket (le)
    assert buckets[30.0] == 3
    assert buckets[float("inf")] == 4
    assert abs(h.total - 60.0012) < 1e-6


def test_series_are_bounded() -> None:
    m = ProxyMetrics()
    for i in range(MAX_SERIES + 10):
        m.record(
            {
                "client_id": f"c{i}",
                "decision": "allow",
                "reason": "allow_rule",
                "bytes_up": 1,
                "bytes_down": 1,
            }
        )
    series = m.request_series()
    assert len(series) <= MAX_SERIES
    assert sum(n for *_, n in series) == MAX_SERIES + 10
    up, _ = m.byte_series()
    assert len(up) <= MAX_SERIES
    assert sum(up.values()) == MAX_SERIES + 10


def test_exact_rules() -> None:
    assert exact_rule("https", "a.test", 443) == "https://a.test"
    assert exact_rule("https", "a.test", 7000) == "a.test:7000"
    assert exact_rule("http", "a.test", 80) == "http://a.test"
    assert exact_rule("http", "2001:db8::1", 8080) == "http://[2001:db8::1]:8080"

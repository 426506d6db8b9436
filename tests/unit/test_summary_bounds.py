"""Per-sandbox structures are bounded (issue 19 item 4, docs/proxy.md#per-sandbox-bounds).

Repro: `ExecutionSummary.by_host` kept every distinct host; 180k unique names took the proxy
from 74 to 205 MB (~550 B a host) with no end. Here 200k distinct hosts go through one
sandbox's summary on the path every access record takes (`Observers.record`, called by
`Steps.emit`), and the RSS growth is bounded.
"""

from __future__ import annotations

import gc
import os

from egress.proxy.telemetry.observe import MAX_SUMMARY_HOSTS, ExecutionSummary, Observers


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_200k_distinct_hosts_through_one_sandbox_bound_the_rss() -> None:
    observers = Observers(None)
    summary = observers.track("sb")
    gc.collect()
    before = _rss()
    for i in range(200_000):
        decision = "block" if i % 1000 == 0 else "allow"
        observers.record(
            {"client_id": "sb", "decision": decision, "reason": "r", "host": f"h{i}.agent.test"}
        )
        observers.record(
            {"client_id": "sb", "decision": "allow", "reason": "r", "host": "pypi.test"}
        )
    grown = _rss() - before
    assert grown < 24 * 1024 * 1024, f"RSS grew {grown / 1e6:.1f} MB for 200k hosts"
    assert len(summary.by_host) <= 2 * MAX_SUMMARY_HOSTS
    final = observers.untrack("sb")
    assert len(final.by_host) == MAX_SUMMARY_HOSTS
    # totals exact; kept + folded = everything
    assert final.total == 400_000
    kept = sum(sum(c.values()) for c in final.by_host.values())
    assert kept + sum(final.other.values()) == 400_000
    assert final.other_hosts + len(final.by_host) == 200_001
    # the heavy hitter and every refused host (200 of them) are among the kept
    assert final.by_host["pypi.test"] == {"allow": 200_000}
    assert len(final.blocked_hosts) == 200


def test_a_small_summary_is_exact() -> None:
    summary = ExecutionSummary("sb")
    for host in ("a.test", "b.test", "a.test"):
        summary.add({"decision": "allow", "reason": "allow_rule", "host": host})
    summary.trim()
    assert summary.by_host == {"a.test": {"allow": 2}, "b.test": {"allow": 1}}
    assert (summary.other_hosts, summary.other) == (0, {})

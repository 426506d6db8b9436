"""Policy decision time: µs per verdict for policies of 10 and 1,000 rules.

Run as ``python -m bench.policy_bench --json`` (the bench runs it pinned to the proxy's core).
A verdict is what the proxy computes per request: `make_target` (canonicalize the host) then
`judge` (policy decision, then the address guard); `decide_p50_us` is the policy decision
alone on a prepared target. Each case is timed in batches of BATCH
verdicts; p50/p99 are over the batches, divided by BATCH. Decisions are not cached here.
"""

from __future__ import annotations

import argparse
import functools
import ipaddress
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from bench import rules as rulesmod

BATCH = 200
BATCHES = 200
SIZES = (10, 1000)

# (case, CONNECT host, resolved addresses): a hit of each rule form, a block, a miss. The
# hits use index 0 of each generated family, so they exist in the 10-rule policy too.
CASES: list[tuple[str, str, tuple[str, ...]]] = [
    ("wildcard allow", "www.example-0.com", ("198.51.100.7",)),
    ("URL origin allow", "pkg-0.dev", ("198.51.100.8",)),
    ("wildcard block", "ads.tracker-0.net", ()),
    ("CIDR allow", "10.0.0.9", ()),
    ("default deny", "unlisted.example.org", ("198.51.100.9",)),
]


def _policy_rules(n: int) -> tuple[list[str], list[str]]:
    r = rulesmod.generate(n_allow=n - n * 2 // 5, n_block=n * 2 // 5)
    allow = r.allow_wildcards + r.allow_hosts + r.allow_origins + r.allow_cidrs
    return allow, r.block_wildcards + r.block_cidrs


def _timed(fn: Callable[[], object]) -> list[float]:
    """Sorted µs per call, one value per batch of BATCH calls."""
    per_batch = []
    for _ in range(BATCHES):
        t = time.perf_counter()
        for _ in range(BATCH):
            fn()
        per_batch.append((time.perf_counter() - t) / BATCH * 1e6)
    return sorted(per_batch)


def measure() -> dict[str, Any]:
    from egress.policy.addrs import AddressGuard
    from egress.policy.judge import judge
    from egress.policy.rules import Policy
    from egress.policy.target import make_target

    guard = AddressGuard()
    results = []
    for n in SIZES:
        allow, block = _policy_rules(n)
        t0 = time.perf_counter()
        policy = Policy(allow=allow, block=block, default="deny")
        load_ms = (time.perf_counter() - t0) * 1e3
        for case, host, addrs in CASES:
            ips = tuple(ipaddress.ip_address(a) for a in addrs)
            target = make_target("https", host, 443)
            verdict = judge(policy, guard, target, ips)

            def verdict_of(p: Any = policy, h: str = host, i: Any = ips) -> object:
                return judge(p, guard, make_target("https", h, 443), i)

            full = _timed(verdict_of)
            decide = _timed(functools.partial(policy.decide, target, ips))
            results.append(
                {
                    "rules": len(allow) + len(block),
                    "case": case,
                    "verdict": f"{verdict.action} {verdict.reason}",
                    "p50_us": statistics.median(full),
                    "p99_us": full[int(0.99 * (len(full) - 1))],
                    "decide_p50_us": statistics.median(decide),
                    "n": BATCH * BATCHES,
                    "policy_load_ms": load_ms,
                }
            )
    return {"results": results}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.policy_bench")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    try:
        out = measure()
    except ImportError as exc:
        out = {"skipped": f"policy engine not importable: {exc}"}
    if args.json:
        print(json.dumps(out))
    else:
        for row in out.get("results", []):
            print(
                f"{row['rules']:>5} rules  {row['case']:<18} {row['p50_us']:7.2f} µs p50 "
                f"(decide alone {row['decide_p50_us']:.2f})  -> {row['verdict']}"
            )
        if "skipped" in out:
            print(out["skipped"])
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Optional figures from modules written in parallel: each is skipped, with a note, when its
module or script is absent at run time.

- policy: `python -m bench.policy_bench --json` (needs `egress.policy`), on the proxy's core.
- netcut: `python bench/netcut_bench.py --json` (cut_ms_p50, cut_ms_p99, ...), if present.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from bench.proxies import PROXY_CPU, REPO, pinned

NETCUT_SCRIPT = REPO / "bench" / "netcut_bench.py"
TIMEOUT_S = 300


def _run_json(argv: list[str]) -> dict[str, Any]:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=REPO)
    except subprocess.TimeoutExpired:
        return {"skipped": f"timed out after {TIMEOUT_S} s"}
    lines = [x for x in out.stdout.splitlines() if x.strip().startswith("{")]
    if out.returncode != 0 or not lines:
        tail = (out.stderr or out.stdout).strip().splitlines()[-1:] or [""]
        return {"skipped": f"exit {out.returncode}: {tail[0][:200]}"}
    try:
        data: dict[str, Any] = json.loads(lines[-1])
    except json.JSONDecodeError as exc:
        return {"skipped": f"no JSON object in its output ({exc})"}
    return data


def policy() -> dict[str, Any]:
    return _run_json(pinned([sys.executable, "-m", "bench.policy_bench", "--json"], PROXY_CPU))


def netcut() -> dict[str, Any]:
    if not NETCUT_SCRIPT.exists():
        return {"skipped": "bench/netcut_bench.py is not in this checkout yet"}
    data = _run_json([sys.executable, str(NETCUT_SCRIPT), "--json"])
    return data if "skipped" in data else {"result": data}


def run_all() -> dict[str, Any]:
    return {"policy": policy(), "netcut": netcut()}

"""The README's main command: the demo tells the whole story and exits 0."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from egress.audit.read import is_lifecycle, is_request

import harness
from servers import run

pytestmark = pytest.mark.netns


async def test_demo_runs_end_to_end_and_cleans_up() -> None:
    rc, out, err = await run(sys.executable, "-m", "egress.demo", timeout=120)
    assert rc == 0, out + err
    for needle in (
        "1. Setup, online",
        "2. The cut",
        "3. The agent",
        "4. The audit",
        "403 block_rule",
        "403 reserved_address",
        "OK: ",
    ):
        assert needle in out
    assert "egdemo-" not in harness.ip("netns", "list").stdout


async def test_demo_log_counts_and_policy_hashes_are_true(tmp_path: Path) -> None:
    """The demo's own log (issue: `events: 8 block: 4` for 3 blocks; hashes matching no
    policy record; an undocumented `source`)."""
    log = tmp_path / "demo.jsonl"
    rc, out, err = await run(
        sys.executable, "-m", "egress.demo", "--audit-log", str(log), timeout=120
    )
    assert rc == 0, out + err
    records = [json.loads(line) for line in log.read_text().splitlines()]
    documented = _documented_policy_sources()
    latest: dict[object, str] = {}
    requests = 0
    for record in records:
        if record.get("type") == "policy":
            assert record["source"] in documented, record
            latest[record["client_id"]] = record["policy"]
        elif is_request(record) and "policy" in record:
            requests += 1
            assert latest.get(record["client_id"]) == record["policy"], record
    assert requests >= 4
    blocks = sum(1 for r in records if is_request(r) and r["decision"] == "block")
    lifecycle = sum(1 for r in records if is_lifecycle(r))
    assert lifecycle == 2
    shown = out.split("== 4. The audit", 1)[1]
    total = sum(1 for r in records if is_request(r))
    assert f"events: {total}  block: {blocks}  allow: " in shown
    assert f"(and {lifecycle} lifecycle records)" in shown
    by_host = shown.split("By host:", 1)[1].split("By registrable domain:", 1)[0]
    assert "egdemo-sandbox" not in by_host


def _documented_policy_sources() -> set[str]:
    """The `source` values docs/audit-log.md lists in its `policy` control record row."""
    text = (Path(__file__).parents[2] / "docs" / "audit-log.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `policy` | `client_id`"))
    listed = row.split("`source` (", 1)[1].split("), `canonical`", 1)[0]
    return set(re.findall(r"`(\w+)`:", listed))

"""Lifecycle records are not requests (issue: the demo's `events: 8 block: 4` for fewer
blocks): summarize, filter, tail and suggest count and show them apart
(docs/audit-log.md#sandbox-records)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from egress.audit.cli import audit_main
from egress.audit.log import AuditLog

SANDBOX = "task-sbx"


def lifecycle(reason: str, detail: str) -> dict[str, object]:
    """The record `prepare_execution`/`release_execution` write (boundary/sandboxes.py)."""
    return {
        "client": "-",
        "method": "SANDBOX",
        "scheme": "",
        "host": SANDBOX,
        "port": 0,
        "client_id": SANDBOX,
        "decision": "block" if reason == "sandbox_removed" else "allow",
        "reason": reason,
        "rule": None,
        "detail": detail,
    }


def request(host: str, decision: str, reason: str, **extra: object) -> dict[str, object]:
    return {
        "client": "127.0.0.1:4000",
        "method": "GET",
        "scheme": "http",
        "host": host,
        "port": 80,
        "client_id": SANDBOX,
        "decision": decision,
        "reason": reason,
        "rule": extra.pop("rule", None),
        **extra,
    }


PROBE = {
    "client": "127.0.0.1:5000",
    "method": "PROBE",
    "scheme": "tcp",
    "host": "127.0.0.1",
    "port": 15001,
    "client_id": SANDBOX,
    "mode": "transparent",
    "orig_dst": "127.0.0.1:15001",
    "decision": "allow",
    "reason": "listener_probe",
    "rule": None,
    "detail": "prepare_execution's probe of the transparent listener",
}


@pytest.fixture
async def log(tmp_path: Path) -> str:
    path = tmp_path / "audit.jsonl"
    async with AuditLog(str(path)) as audit:
        for record in (
            PROBE,
            lifecycle("sandbox_added", "policy Policy(default='deny')"),
            request("pypi.test", "allow", "allow_rule", rule="pypi.test"),
            request("evil.test", "block", "block_rule", rule="evil.test"),
            request(
                "gone.test",
                "error",
                "dns_error",
                would="block",
                would_reason="block_rule",
                rule="gone.test",
            ),
            lifecycle("sandbox_removed", "released"),
        ):
            audit.record(dict(record))
    return str(path)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = audit_main(list(argv))
    return code, capsys.readouterr().out


def test_summarize_counts_requests_only(log: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(capsys, "summarize", "--json", log)
    assert code == 0
    summary = json.loads(out)
    assert summary["totals"] == {
        "events": 3,
        "allow": 1,
        "block": 1,
        "error": 1,
        "other": 0,
        "lifecycle": 3,
    }
    hosts = {row["key"] for row in summary["by_host"]}
    assert SANDBOX not in hosts
    assert "127.0.0.1" not in hosts
    assert SANDBOX not in {row["key"] for row in summary["by_domain"]}
    reasons = {row["key"] for row in summary["by_reason"]}
    assert not reasons & {"sandbox_added", "sandbox_removed", "listener_probe"}
    assert summary["lifecycle"] == [
        {"sandbox": "127.0.0.1", "event": "listener_probe", "count": 1},
        {"sandbox": SANDBOX, "event": "sandbox_added", "count": 1},
        {"sandbox": SANDBOX, "event": "sandbox_removed", "count": 1},
    ]
    code, out = run(capsys, "summarize", log)
    assert "events: 3  block: 1  allow: 1  error: 1  (and 3 lifecycle records)" in out
    section = out.split("Sandbox lifecycle (not requests, not counted above):\n", 1)[1]
    assert f"1  sandbox_removed  {SANDBOX}" in section


def test_filter_by_decision_never_prints_lifecycle(
    log: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _, out = run(capsys, "filter", "--decision", "block", log)
    assert out.count("\n") == 1
    assert "evil.test" in out
    assert "SANDBOX" not in out
    _, out = run(capsys, "filter", log)
    lines = out.splitlines()
    assert len(lines) == 6
    assert " --- sandbox_removed task-sbx (task-sbx) -- released" in lines[-1]
    assert " --- listener_probe 127.0.0.1:15001 from 127.0.0.1:5000" in lines[0]
    assert not any(" block SANDBOX " in line for line in lines)
    _, out = run(capsys, "filter", "--reason", "sandbox_added", log)
    assert out.count("\n") == 1
    assert "--- sandbox_added" in out
    _, out = run(capsys, "tail", "-n", "1", log)
    assert "--- sandbox_removed" in out


def test_suggest_accounts_for_every_record(log: str, capsys: pytest.CaptureFixture[str]) -> None:
    _, out = run(capsys, "suggest", log)
    assert "# 3 request records" in out
    assert "# 3 sandbox lifecycle record(s): not requests, left out" in out
    # the report-only block-rule hit that then failed DNS is still a block-rule hit
    blocked = out.split("# refused by a block rule; not allowed (keep the block rule):\n")[1]
    assert "gone.test:80  1 record(s)  rule 'gone.test'" in blocked
    assert "evil.test:80  1 record(s)" in blocked
    assert '"http://pypi.test",  # 1' in out
    counted = sum(
        int(line.split("record(s)")[0].split()[-1])
        for line in out.splitlines()
        if line.startswith("#   ") and "record(s)" in line
    )
    allowed = sum(1 for line in out.splitlines() if line.startswith('    "'))
    assert counted + allowed == 3  # every request record is accounted for, once


def test_verify_counts_requests_not_lifecycle(log: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(capsys, "verify", log)
    assert code == 0
    assert ", 3 request records;" in out

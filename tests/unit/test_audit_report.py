"""`egress audit report --html` on a large log: one page, memory bounded by distinct hosts,
clients and time slices, never by lines (docs/audit-log.md#egress-audit-report). The browser
tests are tests/integration/test_audit_report_browser.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from test_audit_cli import HOSTS

from egress.audit.format import FORMAT, GENESIS, chain_line, encode_record, line_hash
from egress.audit.report import MAX_SLICES, ReportData

PEAK_SCRIPT = textwrap.dedent("""
    import json, resource, sys, time
    from egress.audit.cli import audit_main
    started = time.monotonic()
    code = audit_main(["report", "--html", sys.argv[2], sys.argv[1]])
    elapsed = time.monotonic() - started
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"code": code, "peak_kib": peak_kib, "seconds": elapsed}), file=sys.stderr)
""")


def write_chained_log(path: Path, lines: int) -> None:
    """`lines` request lines (as `write_big_log`: HOSTS hosts, a block every 7th line, a new
    client port each) in one run with a valid hash chain, start and end records included,
    so verify passes and the report's memory is what its tables cost."""
    run = "ab" * 16
    out, prev, seq = [], GENESIS, 0

    def emit(body: str) -> None:
        nonlocal prev, seq
        line = chain_line(body, seq, prev)
        out.append(line)
        prev, seq = line_hash(line), seq + 1

    start = {"type": "start", "run": run, "format": FORMAT, "pid": 1, "fail_mode": "open"}
    emit(encode_record({**start, "keep_query": False, "rotate_bytes": None}))
    with path.open("wb") as sink:
        for n in range(lines):
            block = n % 7 == 0
            minute, second = (n // 60) % 60, n % 60
            decision, reason = ("block", "default_deny") if block else ("allow", "allow_rule")
            emit(
                f'{{"ts":"2026-11-30T05:{minute:02d}:{second:02d}.000Z",'
                f'"client":"198.18.0.{n % 4}:{1024 + n % 60000}","client_id":"task-{n % 4}",'
                f'"method":"CONNECT","scheme":"https","host":"h{n % HOSTS}.example.com",'
                f'"port":443,"decision":"{decision}","reason":"{reason}","rule":null}}'
            )
            if len(out) >= 50_000:
                sink.write(b"\n".join(out) + b"\n")
                out.clear()
        emit(encode_record({"type": "end", "run": run, "lines": seq, "requests": lines,
                            "write_errors": 0, "dropped": 0}))  # fmt: skip
        sink.write(b"\n".join(out) + b"\n")


def report_peak(log: Path, page: Path) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", PEAK_SCRIPT, str(log), str(page)],
        capture_output=True, text=True, check=False, timeout=300,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )  # fmt: skip
    stats: dict[str, float] = json.loads(done.stderr.strip().splitlines()[-1])
    return stats


@pytest.mark.timeout(300)
def test_a_million_lines_in_bounded_memory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    small, big = tmp_path / "small.jsonl", tmp_path / "big.jsonl"
    write_chained_log(small, 10_000)
    write_chained_log(big, 1_000_000)
    small_stats = report_peak(small, tmp_path / "small.html")
    big_stats = report_peak(big, tmp_path / "big.html")
    page = (tmp_path / "big.html").read_text()
    assert big_stats["code"] == 0
    assert 'data-ok="true"' in page
    cells = dict(re.findall(r'<td class="n" data-count="(\w+)">(\d+)</td>', page))
    assert int(cells["requests"]) == 1_000_000
    assert int(cells["block"]) == len(range(0, 1_000_000, 7))
    assert page.count('class="blocked-host"') == HOSTS
    # 100x the lines (175 MB) may not cost more than a few MB more than the small log
    assert big_stats["peak_kib"] - small_stats["peak_kib"] < 16 * 1024, (small_stats, big_stats)
    with capsys.disabled():
        print(
            f"\n[measure] report of 1,000,000 lines ({big.stat().st_size / 1e6:.0f} MB): "
            f"{big_stats['seconds']:.1f} s, peak RSS {big_stats['peak_kib'] / 1024:.0f} MiB "
            f"(10,000 lines: {small_stats['peak_kib'] / 1024:.0f} MiB), page "
            f"{len(page.encode()) / 1024:.0f} KiB"
        )


def test_time_slices_coarsen_instead_of_growing() -> None:
    data = ReportData()
    started = time.monotonic()
    for n in range(MAX_SLICES + 10):  # one distinct second each: more slices than kept
        minute, second = divmod(n, 60)
        hour, minute = divmod(minute, 60)
        day, hour = divmod(hour, 24)
        ts = f"2026-11-{1 + day:02d}T{hour:02d}:{minute:02d}:{second:02d}.000Z"
        data.add({"client_id": "c", "host": "h", "decision": "allow", "reason": "x", "ts": ts})
    assert data.resolution == 16  # seconds became minutes
    assert data.slices <= MAX_SLICES
    assert sum(c[0] for c in data.timeline["c"].values()) == MAX_SLICES + 10
    assert time.monotonic() - started < 60


# ---- issue 32: what the agent reached, errors, clients, tunnels vs requests ---------------

REACHED = [
    {"client": "198.18.0.2:1", "client_id": "task-7", "method": "CONNECT", "scheme": "https",
     "host": "pypi.org", "port": 443, "decision": "allow", "reason": "allow_rule",
     "rule": "pypi.org", "bytes_up": 100, "bytes_down": 2000},
    {"client": "198.18.0.2:2", "client_id": "task-7", "method": "GET", "scheme": "http",
     "host": "api.test", "port": 8080, "decision": "allow", "reason": "allow_rule",
     "rule": "http://api.test:8080", "bytes_up": 10, "bytes_down": 20},
    {"client": "198.18.0.3:1", "client_id": "task-8", "method": "CONNECT", "scheme": "https",
     "host": "pypi.org", "port": 443, "mode": "socks5", "decision": "allow",
     "reason": "allow_rule", "rule": "pypi.org", "bytes_up": 1, "bytes_down": 2},
    {"client": "198.18.0.3:2", "client_id": "task-8", "method": "CONNECT", "scheme": "https",
     "host": "gone.test", "port": 443, "decision": "error", "reason": "dns_error",
     "rule": None, "detail": "gone.test: name does not resolve"},
    {"client": "198.18.0.3:3", "client_id": "task-8", "method": "GET", "scheme": "http",
     "host": "", "port": 0, "decision": "error", "reason": "bad_request", "rule": None,
     "detail": "origin-form request"},
    {"client": "198.18.0.3:4", "method": "-", "scheme": "", "host": "", "port": 0,
     "decision": "error", "reason": "too_many_connections", "rule": None},
    {"client": "198.18.0.3:5", "client_id": "task-8", "method": "CONNECT", "scheme": "https",
     "host": "evil.test", "port": 443, "decision": "block", "reason": "default_deny",
     "rule": None},
]  # fmt: skip


def _page(tmp_path: Path) -> tuple[Path, str]:
    import asyncio

    from egress.audit.cli import audit_main
    from egress.audit.log import AuditLog

    async def write(path: Path) -> None:
        async with AuditLog(str(path)) as log:
            for record in REACHED:
                log.record(record)

    log = tmp_path / "audit.jsonl"
    asyncio.run(write(log))
    page = tmp_path / "report.html"
    assert audit_main(["report", "--html", str(page), str(log)]) == 0
    return page, page.read_text()


def rows(page: str, cls: str) -> list[dict[str, str]]:
    return [
        dict(re.findall(r'data-([\w-]+)="([^"]*)"', attrs))
        for attrs in re.findall(rf'<tr class="{cls}"([^>]*)>', page)
    ]


def test_the_report_shows_what_was_reached_errors_clients_and_kinds(tmp_path: Path) -> None:
    """Not only the refusals (issue 32): the hosts the agent reached, by host and by client,
    the errors (a name that did not resolve, malformed attempts), a table per client, and
    tunnels apart from requests."""
    _, page = _page(tmp_path)
    reached = {r["host"]: r for r in rows(page, "reached-host")}
    assert set(reached) == {"pypi.org", "api.test"}
    assert (reached["pypi.org"]["tunnels"], reached["pypi.org"]["requests"]) == ("2", "0")
    assert reached["api.test"]["requests"] == "1"
    clients = {r["client"]: r for r in rows(page, "client")}
    assert set(clients) == {"task-7", "task-8", "198.18.0.3"}
    assert (clients["task-7"]["allow"], clients["task-7"]["hosts"]) == ("2", "2")
    assert (clients["task-8"]["tunnels"], clients["task-8"]["error"]) == ("3", "2")
    errors = {(r["reason"], r["where"]): int(r["count"]) for r in rows(page, "error-row")}
    assert errors == {
        ("dns_error", "gone.test:443"): 1,
        ("bad_request", "(no destination)"): 1,
        ("too_many_connections", "(no destination)"): 1,
    }
    kinds = {r["kind"]: r for r in rows(page, "kind")}
    assert (kinds["tunnel"]["allow"], kinds["tunnel"]["block"]) == ("2", "1")
    assert (kinds["tunnel"]["error"], kinds["request"]["allow"]) == ("1", "1")
    assert kinds["nowhere"]["error"] == "2"


def test_error_reasons_are_not_drawn_in_block_red(tmp_path: Path) -> None:
    _, page = _page(tmp_path)
    refusals = re.findall(r'<tr class="refusal (\w+)".*?</tr>', page, flags=re.S)
    assert sorted(set(refusals)) == ["block", "error"]
    for row in re.findall(r'<tr class="refusal error".*?</tr>', page, flags=re.S):
        assert "#c62828" not in row  # a block's red
        assert "stroke-dasharray" in row
    for row in re.findall(r'<tr class="refusal block".*?</tr>', page, flags=re.S):
        assert 'fill="#c62828"' in row


def test_the_report_is_written_0600_like_the_log(tmp_path: Path) -> None:
    stale = tmp_path / f"report.html.tmp{os.getpid()}"
    stale.write_text("left over")
    stale.chmod(0o644)
    page, _ = _page(tmp_path)
    assert page.stat().st_mode & 0o777 == 0o600

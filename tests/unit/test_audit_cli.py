"""`egress audit summarize|filter|tail`: known counts, windows, filters, following, errors."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from audit_samples import SAMPLE, sample_events, write_sample

from egress.audit.cli import audit_main
from egress.audit.follow import Follower, GapFiller
from egress.audit.log import AuditLog
from egress.audit.read import client_ip, host_matches, order_paths
from egress.audit.timebounds import canonical_ts


@pytest.fixture(scope="module")
def sample_log(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    directory = tmp_path_factory.mktemp("cli")
    path = directory / "audit.jsonl"
    asyncio.run(write_sample(str(path), rotate_bytes=8000))
    return order_paths(str(p) for p in directory.iterdir())


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = audit_main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def expected_counts(field: str) -> dict[str, Counter[str]]:
    counts: dict[str, Counter[str]] = {}
    for event in sample_events():
        key = str(event.get(field))
        counts.setdefault(key, Counter())[str(event["decision"])] += 1
    return counts


def as_counts(rows: list[dict[str, object]]) -> dict[str, Counter[str]]:
    return {
        str(row["key"]): Counter({d: int(row[d]) for d in ("allow", "block", "error") if row[d]})
        for row in rows
    }  # type: ignore[call-overload]


# ---- summarize ---------------------------------------------------------------------------


def test_summarize_json_counts(sample_log: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "summarize", "--json", *sample_log)
    assert code == 0
    assert err == ""
    summary = json.loads(out)
    total = sum(count for count, _ in SAMPLE)
    assert summary["totals"] == {
        "events": total,
        "allow": 77,
        "block": 28,
        "error": 2,
        "other": 0,
        "lifecycle": 0,
    }
    assert summary["runs"] == 1
    assert as_counts(summary["by_host"]) == expected_counts("host")
    assert as_counts(summary["by_reason"]) == expected_counts("reason")
    by_rule = as_counts(summary["by_rule"])
    assert by_rule["(none)"] == Counter(block=23, error=2)
    assert by_rule["*.pythonhosted.org"] == Counter(allow=25)
    by_domain = as_counts(summary["by_domain"])
    assert by_domain["github.com"] == Counter(block=9, error=2)  # github.com + gist.github.com
    assert by_domain["pythonhosted.org"] == Counter(allow=25)
    assert by_domain["githubusercontent.com"] == Counter(block=6)
    assert by_domain["169.254.169.254"] == Counter(block=4)
    by_client = as_counts(summary["by_client"])  # client_id, else the IP without its port
    assert by_client == {
        "task-7": Counter(allow=77, block=15),
        "task-8": Counter(block=12, error=2),
        "198.18.0.3": Counter(block=1),
    }
    hosts = [row["key"] for row in summary["by_host"]]
    assert hosts[:3] == ["github.com", "raw.githubusercontent.com", "pastebin.com"]


def test_summarize_table(sample_log: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "summarize", "--top", "3", *sample_log)
    assert code == 0
    assert "events: 107  block: 28  allow: 77  error: 2" in out
    assert "By registrable domain:" in out
    assert "      9      0      0      9  github.com" in out
    assert "... and 5 more" in out  # 8 hosts, 3 shown


def test_summarize_reads_plain_and_gzip_alike(
    sample_log: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    renamed = tmp_path / "no-gz-suffix"
    renamed.write_bytes(Path(sample_log[0]).read_bytes())  # gzip data, no .gz name
    code, out, _ = run(capsys, "summarize", "--json", str(renamed))
    assert code == 0
    assert json.loads(out)["totals"]["events"] > 0


async def write_at(path: Path, stamps: list[datetime]) -> None:
    async with AuditLog(str(path)) as log:
        for index, stamp in enumerate(stamps):
            log.record(
                {
                    "ts": canonical_ts(stamp),
                    "client": "198.18.0.2:1",
                    "host": f"h{index}.example",
                    "port": 443,
                    "decision": "block",
                    "reason": "default_deny",
                    "rule": None,
                }
            )


@pytest.mark.parametrize(
    ("window", "hosts"),
    [
        (["--since", "2026-11-30T01:30:00Z"], {"h1.example", "h2.example"}),
        (["--until", "2026-11-30T03:30:00+01:00"], {"h0.example", "h1.example"}),
        (
            ["--since", "2026-11-30T01:00:00.000Z", "--until", "2026-11-30T02:00:00Z"],
            {"h0.example"},
        ),
        (["--since", "2026-11-30"], {"h0.example", "h1.example", "h2.example"}),
    ],
    ids=["since", "until-offset-exclusive", "both-inclusive-start", "date-only"],
)
def test_time_window_rfc3339(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], window: list[str], hosts: set[str]
) -> None:
    path = tmp_path / "audit.jsonl"
    base = datetime(2026, 11, 30, 1, 0, tzinfo=UTC)
    asyncio.run(write_at(path, [base, base + timedelta(hours=1), base + timedelta(hours=2)]))
    code, out, _ = run(capsys, "summarize", "--json", *window, str(path))
    assert code == 0
    assert {row["key"] for row in json.loads(out)["by_host"]} == hosts


def test_time_window_relative(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "audit.jsonl"
    now = datetime.now(UTC)
    asyncio.run(write_at(path, [now - timedelta(hours=3), now - timedelta(minutes=10)]))
    _, out, _ = run(capsys, "summarize", "--json", "--since", "1h", str(path))
    assert [row["key"] for row in json.loads(out)["by_host"]] == ["h1.example"]
    _, out, _ = run(capsys, "filter", "--until", "2h", str(path))
    assert "h0.example" in out
    assert "h1.example" not in out


# ---- filter and tail ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("selectors", "count"),
    [
        (["--decision", "block"], 28),
        (["--decision", "block", "--decision", "error"], 30),
        (["--host", "*.github.com"], 11),  # the apex github.com and gist.github.com
        (["--host", "*githubusercontent*"], 6),
        (["--client", "task-8"], 14),
        (["--client", "198.18.0.3"], 15),
        (["--client", "198.18.0.2:4000?"], 9),
        (["--reason", "reserved_address"], 4),
        (["--reason", "sni_mismatch", "--host", "pypi.org"], 3),
    ],
    ids=[
        "block",
        "block-or-error",
        "host-wildcard-apex",
        "host-glob",
        "client-id",
        "client-ip",
        "client-ip-port",
        "reason",
        "reason-and-host",
    ],
)
def test_filter(
    sample_log: list[str], capsys: pytest.CaptureFixture[str], selectors: list[str], count: int
) -> None:
    code, out, _ = run(capsys, "filter", *selectors, *sample_log)
    assert code == 0
    assert len(out.splitlines()) == count


def test_filter_line_format(sample_log: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, "filter", "--reason", "reserved_address", *sample_log)
    line = out.splitlines()[0]
    timestamp, rest = line.split(" ", 1)
    assert timestamp.endswith("Z")
    assert rest.startswith(
        "block GET 169.254.169.254:80/latest/meta-data/iam?REDACTED from 198.18.0.3:"
    )
    assert rest.endswith(
        "(task-8) reserved_address status=403 -- 169.254.169.254 is reserved (link_local)"
    )


async def test_agent_controlled_text_cannot_drive_the_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "audit.jsonl"
    async with AuditLog(str(path)) as log:
        log.record(
            {
                "client": "198.18.0.2:1",
                "method": "GET",
                "host": "a.example",
                "port": 80,
                "path": "/x\x1b[2J\n2026-01-01T00:00:00.000Z allow FAKE",
                "decision": "block",
                "reason": "default_deny",
                "rule": None,
                "client_id": "evil\u202etxt.exe",
                "detail": "bell\x07 csi\x9b",
            }
        )
    _, out, _ = run(capsys, "filter", str(path))
    assert out.count("\n") == 1
    assert "\x1b" not in out
    assert "\\x1b[2J\\x0a2026" in out
    assert "evil\\u202etxt.exe" in out
    assert "bell\\x07 csi\\x9b" in out
    _, out, _ = run(capsys, "summarize", str(path))
    assert "\u202e" not in out
    assert "evil\\u202etxt.exe" in out


def test_filter_json_and_control(sample_log: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, "filter", "--json", "--control", *sample_log)
    records = [json.loads(line) for line in out.splitlines()]
    kinds = Counter(record.get("type") for record in records)
    assert kinds["start"] == 1
    assert kinds["end"] == 1
    assert kinds["rotate"] == len(sample_log) - 1
    assert kinds[None] == 107


def test_tail_last_n(sample_log: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, "tail", "-n", "2", *sample_log)
    lines = out.splitlines()
    assert len(lines) == 2
    assert "gist.github.com:443" in lines[0]
    assert "pypi.org:22" in lines[1]
    _, out, _ = run(capsys, "tail", "-n", "3", "--decision", "allow", *sample_log)
    assert all(" allow " in line for line in out.splitlines())


def test_follower_survives_rename_rotation_and_truncation(tmp_path: Path) -> None:
    path = tmp_path / "live.jsonl"
    follower = Follower(str(path))
    assert follower.read() == []  # not there yet
    path.write_bytes(b"one\ntw")
    assert follower.read() == [b"one"]
    with path.open("ab") as stream:
        stream.write(b"o\nthree\n")
    assert follower.read() == [b"two", b"three"]
    with path.open("ab") as stream:
        stream.write(b"four\n")
    path.rename(tmp_path / "live.jsonl.1")  # rotation: the rest of the old file comes first
    assert follower.read() == [b"four"]
    path.write_bytes(b"five\n")
    assert follower.read() == [b"five"]
    path.write_bytes(b"")  # copytruncate
    assert follower.read() == []
    path.write_bytes(b"six\n")
    assert follower.read() == [b"six"]
    follower.close()


async def test_follower_with_gap_filler_survives_rotation_faster_than_polls(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    warnings: list[str] = []
    follower, gaps = Follower(str(path)), GapFiller(str(path), warnings.append)
    seen: list[dict[str, object]] = []
    async with AuditLog(str(path), rotate_bytes=1000) as log:
        for port in range(60):
            log.record(
                {
                    "client": "198.18.0.2:1",
                    "host": "a.example",
                    "port": port,
                    "decision": "allow",
                    "reason": "x",
                    "rule": None,
                }
            )
            await log.flush()
            if port % 15 == 0:  # a slow reader: several rotations go by between polls
                seen += [json.loads(line) for line in gaps.feed(follower.read())]
    while lines := follower.read():
        seen += [json.loads(line) for line in gaps.feed(lines)]
    follower.close()
    assert len(list(tmp_path.glob("audit.jsonl.*.gz"))) > 10
    assert [r["port"] for r in seen if r.get("type") is None] == list(range(60))
    assert warnings == []


async def test_tail_follow_through_writer_rotation(tmp_path: Path) -> None:
    """`tail -f` in a child process follows the log through rotation. In lockstep, so that no
    timing decides the outcome: each `block` record (the ones it prints) is flushed and then
    awaited on the child's stdout before the next records are written, so the child is known
    to have started (and opened the log) before the first rotation, and each rotation renames
    a file the child has read to its end. (Rotations faster than the reader: the in-process
    test above.)"""
    path = tmp_path / "audit.jsonl"
    # SIGINT is how the test stops it, so the child restores Python's handler: a test run
    # started in the background by a non-interactive shell has SIGINT ignored, and that
    # is inherited (the child then never stopped, and the test waited for it in vain).
    script = textwrap.dedent("""
        import signal, sys
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from egress.audit.cli import audit_main
        sys.exit(audit_main(sys.argv[1:]))
    """)
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        script,
        "tail",
        "-f",
        "--interval",
        "0.02",
        "--decision",
        "block",
        str(path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert child.stdout is not None
    seen: list[str] = []
    try:
        async with AuditLog(str(path), rotate_bytes=1500) as log:
            for port in range(30):
                decision = "block" if port % 3 == 0 else "allow"
                log.record(
                    {
                        "client": "198.18.0.2:1",
                        "method": "CONNECT",
                        "host": "a.example",
                        "port": port,
                        "decision": decision,
                        "reason": "x",
                        "rule": None,
                    }
                )
                if decision == "block":
                    await log.flush()
                    # a bound for a hung child, not a measurement
                    line = await asyncio.wait_for(child.stdout.readline(), timeout=120)
                    seen.append(line.decode())
        assert list(tmp_path.glob("audit.jsonl.*.gz"))  # it did rotate under the follower
        assert [int(line.split()[3].rsplit(":", 1)[1]) for line in seen] == list(range(0, 30, 3))
    finally:
        child.send_signal(signal.SIGINT)
        code = await asyncio.wait_for(child.wait(), timeout=60)
    assert code == 0


# ---- errors and helpers ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["summarize", "/nonexistent/audit.jsonl"], "cannot read /nonexistent/audit.jsonl"),
        (["summarize", "--since", "yesterday", "x"], "not an RFC 3339 time"),
        (["filter", "--decision", "maybe", "x"], "invalid choice"),
        (["explode", "x"], "invalid choice"),
        ([], "required"),
        (["tail", "/nonexistent/audit.jsonl"], "cannot read"),
        (["tail", "-f", "--interval", "-1", "x"], "must be > 0"),
        (["summarize", "--top", "0", "x"], "must be > 0"),
        (["tail", "-n", "ten", "x"], "not a number"),
        (["verify", "--head", "nothex", "x"], "not a SHA-256 hash (64 hex digits): nothex"),
        (["verify", "--head", "0" * 63, "x"], "not a SHA-256 hash"),
        (["filter", "--bogus", "x"], "usage: egress audit filter"),
        (["verify", "--hed", "x", "y"], "usage: egress audit verify"),
    ],
    ids=[
        "missing-file",
        "bad-since",
        "bad-decision",
        "bad-command",
        "no-command",
        "tail-missing",
        "bad-interval",
        "bad-top",
        "bad-lines",
        "head-not-hex",
        "head-short",
        "mistyped-option-subcommand-usage",
        "mistyped-verify-option",
    ],
)
def test_usage_errors_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert message in err
    assert "Traceback" not in err


def test_bad_lines_are_counted_named_and_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "audit.jsonl"
    path.write_text('{"host":"a.example","decision":"block"}\nnot json\n[1]\n{"host":"b.exa')
    code, out, err = run(capsys, "summarize", "--json", str(path))
    assert code == 1  # the counts are of the readable lines only
    summary = json.loads(out)
    assert summary["bad_lines"] == 3
    assert summary["totals"]["block"] == 1
    assert f"{path}:2: not a JSON object; skipped" in err
    assert f"{path}:3: not a JSON object; skipped" in err
    assert f"{path}:4: truncated line (no newline); skipped" in err
    assert "3 line(s) were not JSON objects" in err


TRUNCATED = (
    '{"ts":"2026-11-30T05:00:00.000Z","client":"198.18.0.2:1","method":"CONNECT",'
    '"host":"a.example","port":443,"decision":"block","reason":"default_deny","rule":null}\n'
    '{"ts":"2026-11-30T05:00:01.000Z","client":"198.18.0.2:2","method":"CONNECT","host":"b.ex'
)


@pytest.mark.parametrize(
    "argv",
    [
        ["filter"],
        ["filter", "--json"],
        ["filter", "--host", "b.example"],
        ["tail"],
        ["tail", "-n", "1", "--host", "b.example"],
        ["export", "--format", "ocsf"],
        ["suggest"],
    ],
    ids=[
        "filter",
        "filter-json",
        "filter-nothing-matched",
        "tail",
        "tail-nothing-matched",
        "export",
        "suggest",
    ],
)
def test_every_reading_command_names_unreadable_lines_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """A truncated file must not read as "nothing matched" (issue 32): the line is named on
    stderr with its file and line number, and the exit status says lines were skipped."""
    path = tmp_path / "audit.jsonl"
    path.write_text(TRUNCATED)
    code, _, err = run(capsys, *argv, str(path))
    assert code == 1, err
    assert f"{path}:2: truncated line (no newline); skipped" in err
    assert "1 line(s) were not JSON objects" in err
    assert "egress audit verify" in err


def test_tail_follow_names_an_unreadable_line_of_the_live_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`tail -f`: a line the follower reads that is not JSON is named as `PATH:N` too."""
    path = tmp_path / "audit.jsonl"
    path.write_text('{"type":"start","seq":0}\ngarbage\n')
    follower = Follower(str(path))
    lines = follower.read_lines()
    follower.close()
    assert [(line.where, line.data) for line in lines] == [
        (f"{path}:1", b'{"type":"start","seq":0}'),
        (f"{path}:2", b"garbage"),
    ]


def test_a_clean_log_exits_0_with_nothing_on_stderr(
    sample_log: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in (["filter"], ["tail"], ["summarize"], ["export", "--format", "ocsf"]):
        code, _, err = run(capsys, *argv, *sample_log)
        assert code == 0, argv
        assert "not JSON" not in err
        assert "chain looks broken" not in err


def test_summarize_and_export_hint_at_a_broken_chain(
    sample_log: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A line deleted from the middle: summarize and export still answer, but say the chain
    looks broken and to run verify (issue 32)."""
    live = Path(sample_log[-1])
    lines = live.read_bytes().splitlines(keepends=True)
    copy = tmp_path / "audit.jsonl"
    copy.write_bytes(b"".join(lines[:3] + lines[4:]))
    for argv in (["summarize"], ["export", "--format", "ocsf"]):
        code, out, err = run(capsys, *argv, *sample_log[:-1], str(copy))
        assert code == 0
        assert out
        assert "chain looks broken at 1 place(s)" in err, argv
        assert f"{copy}:4: seq " in err
        assert "run `egress audit verify`" in err


def test_an_overlong_line_is_one_bad_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "audit.jsonl"
    path.write_bytes(b"x" * 3_000_000 + b"\n" + b'{"host":"a.example","decision":"allow"}\n')
    code, out, _ = run(capsys, "summarize", "--json", str(path))
    assert code == 1  # one line skipped
    summary = json.loads(out)
    assert summary["bad_lines"] == 1
    assert summary["totals"]["allow"] == 1


def test_messages_show_no_python_values(
    tmp_path: Path, sample_log: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """No `head None`, no `None`/`False`/dict reprs in what a reviewer reads (issue 32)."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    code, out, _ = run(capsys, "verify", str(empty))
    assert code == 1
    assert "head (none: no lines)" in out
    assert "None" not in out
    _, out, _ = run(capsys, "filter", "--control", *sample_log)
    start = next(line for line in out.splitlines() if " --- start " in line)
    assert "keep_query=false" in start
    for python in ("None", "False", "{'"):
        assert python not in out
    path = tmp_path / "policy.jsonl"
    path.write_text(
        '{"type":"policy","ts":"2026-11-30T05:00:00.000Z","client_id":null,'
        '"canonical":{"default":"deny","allow":["a.test"]},"seq":1,"prev":"x"}\n'
        '{"client":"198.18.0.2:1","method":"GET","scheme":"http","host":"","port":0,'
        '"decision":"error","reason":"bad_request","rule":null}\n'
    )
    _, out, _ = run(capsys, "filter", "--control", str(path))
    policy, origin_form = out.splitlines()
    assert 'client_id=null canonical={"default":"deny","allow":["a.test"]}' in policy
    assert " GET - from 198.18.0.2:1 " in origin_form  # no destination: not `:0`


def test_serve_names_the_bad_audit_option_not_the_log() -> None:
    """`egress serve --audit-rotate-bytes 0` without a log said `cannot open the audit log
    None` (issue 32)."""
    done = subprocess.run(
        [sys.executable, "-m", "egress.cli", "serve", "--listen", "127.0.0.1:0",
         "--audit-rotate-bytes", "0", "--quiet"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "--audit-rotate-bytes must be at least 1" in done.stderr
    assert "None" not in done.stderr


def test_a_directory_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "verify", str(tmp_path))
    assert code == 2
    assert "cannot read" in err


@pytest.mark.parametrize(
    ("given", "ordered"),
    [
        (
            ["a.log", "a.log.1.gz", "a.log.10.gz", "a.log.2.gz"],
            ["a.log.10.gz", "a.log.2.gz", "a.log.1.gz", "a.log"],
        ),
        (["x.jsonl", "y.jsonl"], ["x.jsonl", "y.jsonl"]),
        (["a.log.2", "a.log.1.gz", "b.log"], ["a.log.2", "a.log.1.gz", "b.log"]),
        (["a.log", "a.log"], ["a.log"]),
    ],
    ids=["glob-order", "unrelated-kept", "uncompressed-rotated", "duplicates"],
)
def test_order_paths(given: list[str], ordered: list[str]) -> None:
    assert order_paths(given) == ordered


@pytest.mark.parametrize(
    ("client", "ip"),
    [
        ("198.18.0.2:41000", "198.18.0.2"),
        ("[2001:db8::1]:5", "2001:db8::1"),
        ("2001:db8::1", "2001:db8::1"),
        ("unix", "unix"),
    ],
)
def test_client_ip(client: str, ip: str) -> None:
    assert client_ip(client) == ip


def test_host_matches() -> None:
    assert host_matches("*.Example.com", "example.com")
    assert host_matches("*.example.com", "a.b.example.com")
    assert not host_matches("*.example.com", "badexample.com")
    assert host_matches("api-?.example.com", "API-1.example.com")


# ---- a million lines in bounded memory ---------------------------------------------------

HOSTS = 200


def write_big_log(path: Path, lines: int) -> None:
    """Writes `lines` request lines quickly: ~175 bytes each, HOSTS distinct hosts, a new
    client port on every line (ports must not count as distinct clients)."""
    template = (
        '{"ts":"2026-11-30T05:%02d:%02d.000Z","client":"198.18.0.%d:%d",'
        '"method":"CONNECT","host":"h%d.example.com","port":443,'
        '"decision":"%s","reason":"%s","rule":null,"seq":%d,"prev":"x"}\n'
    )
    with path.open("w") as out:
        chunk: list[str] = []
        for n in range(lines):
            block = n % 7 == 0
            chunk.append(
                template
                % (
                    (n // 60) % 60,
                    n % 60,
                    n % 4,
                    1024 + n % 60000,
                    n % HOSTS,
                    "block" if block else "allow",
                    "default_deny" if block else "allow_rule",
                    n,
                )
            )
            if len(chunk) == 50_000:
                out.write("".join(chunk))
                chunk.clear()
        out.write("".join(chunk))


PEAK_SCRIPT = textwrap.dedent("""
    import json, resource, sys
    from egress.audit.cli import audit_main
    code = audit_main(["summarize", "--json", sys.argv[1]])
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"code": code, "peak_kib": peak_kib}), file=sys.stderr)
""")


def summarize_peak(path: Path) -> tuple[dict[str, object], int]:
    done = subprocess.run(
        [sys.executable, "-c", PEAK_SCRIPT, str(path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    stats = json.loads(done.stderr.strip().splitlines()[-1])
    assert stats["code"] == 0
    return json.loads(done.stdout), int(stats["peak_kib"])


@pytest.mark.timeout(90)
def test_million_lines_in_memory_bounded_by_distinct_hosts(tmp_path: Path) -> None:
    started = time.monotonic()
    small, big = tmp_path / "small.jsonl", tmp_path / "big.jsonl"
    write_big_log(small, 10_000)
    write_big_log(big, 1_000_000)
    assert big.stat().st_size > 150_000_000
    small_summary, small_peak = summarize_peak(small)
    big_summary, big_peak = summarize_peak(big)
    elapsed = time.monotonic() - started
    totals = big_summary["totals"]
    assert isinstance(totals, dict)
    assert totals["events"] == 1_000_000
    assert totals["block"] == len(range(0, 1_000_000, 7))
    assert len(big_summary["by_host"]) == HOSTS  # type: ignore[arg-type]
    assert len(big_summary["by_client"]) == 4  # type: ignore[arg-type]
    # A 100x larger log (175 MB) may not cost more than a few MB more than the small one:
    # the summary streams and keeps one entry per distinct host, client, reason and rule.
    assert big_peak - small_peak < 8 * 1024, (small_peak, big_peak)
    assert small_summary["totals"]["events"] == 10_000  # type: ignore[index]
    assert elapsed < 60, elapsed


def test_a_truncated_gzip_file_exits_1_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A rotated file cut short is a truncated log as well: named, and exit 1."""
    import gzip

    line = TRUNCATED.split("\n")[0].encode() + b"\n"
    whole = gzip.compress(
        b"".join(line.replace(b'"port":443', b'"port":%d' % n) for n in range(400))
    )
    path = tmp_path / "audit.jsonl.1.gz"
    path.write_bytes(whole[: len(whole) // 2])  # every line whole JSON: only the cut fails
    for argv in (["filter"], ["summarize"], ["export", "--format", "ocsf"]):
        code, _, err = run(capsys, *argv, str(path))
        assert code == 1, argv
        assert "compressed data is damaged or ends early" in err

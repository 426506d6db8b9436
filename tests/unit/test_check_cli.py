"""`egress check` per docs/policy.md#egress-check, run as the real console script."""

import subprocess
import sys
from pathlib import Path

import pytest


def egress(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "egress.cli", *args], capture_output=True, text=True, timeout=60
    )


def test_done_means_example() -> None:
    r = egress(
        "check",
        "--allow",
        "*.example.com",
        "--block",
        "evil.example.com",
        "https://api.example.com",
        "http://evil.example.com/x",
        "example.com:22",
    )
    lines = r.stdout.splitlines()
    assert r.returncode == 1
    assert [ln.split()[:2] for ln in lines] == [
        ["allow", "https://api.example.com"],
        ["block", "http://evil.example.com/x"],
        ["block", "example.com:22"],
    ]


def test_all_allowed_exits_zero() -> None:
    r = egress("check", "--allow", "example.com", "example.com", "http://example.com/")
    assert r.returncode == 0
    assert r.stdout.count("\nallow ") + r.stdout.startswith("allow ") == 2


@pytest.mark.parametrize(
    "args",
    [
        ["--allow", "a[b].com", "x.com"],
        ["--default", "maybe", "x.com"],
        ["evil.com/x"],
        ["example.com:"],
        ["ftp://example.com/"],
        ["--policy", "/nonexistent.toml", "x.com"],
        [],
    ],
    ids=["bad-rule", "bad-default", "bad-target", "empty-port", "bad-scheme", "no-file", "none"],
)
def test_usage_errors_exit_2_without_traceback(args: list[str]) -> None:
    r = egress("check", *args)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert r.stderr.strip()


def test_loopback_spellings_blocked_even_under_default_allow() -> None:
    targets = [
        "http://2130706433/",
        "0177.0.0.1:443",
        "0x7f.1",
        "http://127.1/",
        "[::ffff:127.0.0.1]:443",
        "[::1]:443",
    ]
    r = egress("check", "--default", "allow", *targets)
    assert r.returncode == 1
    assert all("reserved_address" in ln for ln in r.stdout.splitlines())
    assert len(r.stdout.splitlines()) == len(targets)


def test_policy_file_and_lint(tmp_path: Path) -> None:
    f = tmp_path / "p.toml"
    f.write_text(
        'default = "deny"\nallow = ["*.com", "https://ok.org/path"]\nblock = ["bad.com"]\n'
    )
    r = egress("check", "--policy", str(f), "--lint", "bad.com", "ok.org")
    assert r.returncode == 1
    out = r.stdout
    assert "lint: allow rule '*.com': covers a whole public suffix" in out
    assert "URL path is ignored" in out
    assert "block bad.com block_rule" in out
    assert "allow ok.org allow_rule" in out


def test_resolve_pin_judged_by_guard() -> None:
    r = egress(
        "check", "--allow", "example.test", "--resolve", "example.test=127.0.0.1", "example.test"
    )
    assert r.returncode == 1
    assert "reserved_address" in r.stdout

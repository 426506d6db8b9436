"""Help texts and small CLI promises from docs/proxy.md and docs/user-guide.md."""

from __future__ import annotations

import subprocess
import sys

import pytest

from egress.cli import build_parser


def help_of(*argv: str) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args([*argv, "--help"])
    assert info.value.code == 0


def test_demo_help_prints_help_and_runs_nothing() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "egress.demo", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0
    # `python -m egress.demo --help` said `usage: ./dev.sh demo` (issue 22)
    assert out.stdout.startswith("usage: python -m egress.demo ")
    assert "--audit-log PATH" in out.stdout
    assert "an agent's network, cut down" not in out.stdout  # the story did not start


def test_help_texts(capsys: pytest.CaptureFixture[str]) -> None:
    help_of()
    top = capsys.readouterr().out
    assert "SPEC" not in top
    help_of("serve")
    serve = capsys.readouterr().out
    for needle in (
        "(default: 16384)",
        "(default: 10.0)",
        "(default: 1024)",
        "--admin HOST:PORT",
        "a malformed ClientHello is always refused",
    ):
        assert needle in " ".join(serve.split()), needle
    help_of("check")
    check = " ".join(capsys.readouterr().out.split())
    for needle in (
        "TARGET a URL",
        "--client NAME",
        "--framework-route URL a framework",
        "--resolve NAME=ADDR pin",
        "--reserve CIDR also refuse",
    ):
        assert needle in check, needle

"""`egress serve` lints its policy in a child process: the child's imports must resolve."""

from __future__ import annotations

import pytest

from egress.config import build_settings
from egress.serve import _lint_in_child


def test_lint_child_reports_findings(capsys: pytest.CaptureFixture[str]) -> None:
    _lint_in_child(build_settings({"allow": ["*.com", "x.test"]}))
    err = capsys.readouterr().err
    assert "did not run" not in err
    assert "'*.com': covers a whole public suffix" in err


def test_lint_child_flags_the_address_opt_in(capsys: pytest.CaptureFixture[str]) -> None:
    """The opt-in that makes every refused name a lookup is a start-up warning, for the
    top-level policy and each client that sets it (docs/policy.md#no-lookup-decides-nothing)."""
    settings = build_settings(
        {
            "allow": ["198.18.0.0/15"],
            "resolve_names_for_address_rules": True,
            "clients": {"sb": {"token": "t", "allow": ["198.18.0.0/15"]}},
        }
    )
    _lint_in_child(settings)
    lines = capsys.readouterr().err.splitlines()
    key = "policy key 'resolve_names_for_address_rules': every name"
    assert any(line.startswith(f"egress serve: warning: lint: {key}") for line in lines), lines
    assert any(f"client 'sb': lint: {key}" in line for line in lines), lines
    _lint_in_child(build_settings({"allow": ["198.18.0.0/15"]}))
    assert capsys.readouterr().err == ""

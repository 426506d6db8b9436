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

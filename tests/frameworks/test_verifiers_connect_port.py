"""verifiers' runtimes decide CONNECT ports as verifiers' own proxy by default (443 for a
rule without a port), and widen to every port only when asked: `any_connect_port=True`, the
namespace config's field, or `EGRESS_VERIFIERS_ANY_CONNECT_PORT=1` (issue 31: a user who
switched got a wider policy without asking). Runs verifiers 0.4.0's own config classes in
its venv."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from .frameworkvenv import framework_venv

HERE = Path(__file__).resolve().parent


@pytest.mark.timeout(600)
def test_any_connect_port_is_an_opt_in(tmp_path_factory: pytest.TempPathFactory) -> None:
    venv = framework_venv("verifiers", tmp_path_factory.getbasetemp())
    env = {k: v for k, v in os.environ.items() if k != "EGRESS_VERIFIERS_ANY_CONNECT_PORT"}
    proc = subprocess.run(
        [str(venv / "bin" / "python"), str(HERE / "vf_connect_port_check.py")],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = json.loads(proc.stdout.splitlines()[-1])
    # [CONNECT a.test:443, CONNECT a.test:8443]
    assert said["docker-default"] == [True, False]
    assert said["namespace-default"] == [True, False]
    assert said["docker-opt-in"] == [True, True]
    assert said["namespace-field"] == [True, True]
    assert said["docker-env"] == [True, True]
    assert said["docker-env-keyword-off"] == [True, False]  # the keyword wins
    assert "must be 0 or 1" in said["env-typo"]

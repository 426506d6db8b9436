"""Harbor's own classes with ours, in Harbor's venv (`harbor_checks.py` says what is
checked): the docker environment without Harbor's sidecar, Harbor refusing IPv6 entries, and
the per-phase policy with the model host as a framework route."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from .harborvenv import harbor_venv


@pytest.mark.timeout(900)
def test_harbor_environment_classes(tmp_path_factory: pytest.TempPathFactory) -> None:
    venv = harbor_venv(tmp_path_factory.getbasetemp())
    checks = Path(__file__).with_name("harbor_checks.py")
    done = subprocess.run(
        [str(venv / "bin" / "python"), str(checks)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("\nok ") + done.stdout.startswith("ok ") == 6, done.stdout

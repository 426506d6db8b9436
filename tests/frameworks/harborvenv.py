"""Harbor 0.26.0 in a Python 3.12 venv of the tests' own (Harbor needs Python >= 3.12; ours
runs on 3.11).

`./dev.sh test` creates `.venv-harbor` before pytest starts and exports
`EGRESS_HARBOR_VENV`; without it, the first test that needs Harbor creates one under the
run's temporary directory (a PyPI install, a minute or so). The interpreter is
`EGRESS_PYTHON312`, else `python3.12` on PATH, else pyenv's 3.12.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from pathlib import Path

HARBOR = "harbor==0.26.0"
REPO = Path(__file__).resolve().parents[2]


def python312() -> str:
    candidates = [
        os.environ.get("EGRESS_PYTHON312", ""),
        shutil.which("python3.12") or "",
        *sorted(glob.glob("/root/.pyenv/versions/3.12*/bin/python"), reverse=True),
    ]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK) and _runs(candidate):
            return candidate
    raise RuntimeError(
        "Harbor needs Python >= 3.12: set EGRESS_PYTHON312 or install python3.12 "
        "(./dev.sh test does)"
    )


def _runs(python: str) -> bool:
    """A pyenv shim is on PATH even where its version is not selected, and then exits 127:
    such a candidate is skipped, as dev.sh skips it."""
    try:
        return subprocess.run([python, "-c", ""], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _ready(venv: Path) -> bool:
    python = venv / "bin" / "python"
    if not python.exists():
        return False
    probe = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('harbor'))"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if probe.returncode != 0 or probe.stdout.strip() != HARBOR.split("==")[1]:
        return False
    # and this checkout's egress, which Harbor imports the integration from
    where = subprocess.run(
        [str(python), "-c", "import egress; print(egress.__file__)"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return where.returncode == 0 and where.stdout.strip().startswith(str(REPO))


def create(venv: Path) -> None:
    subprocess.run([python312(), "-m", "venv", str(venv)], check=True, timeout=300)
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
         "--disable-pip-version-check", HARBOR, "-e", str(REPO)],
        check=True,
        timeout=1800,
    )  # fmt: skip


def harbor_venv(run_dir: Path) -> Path:
    """A venv with Harbor installed: `EGRESS_HARBOR_VENV`, the repository's `.venv-harbor`,
    or a new one under `run_dir`."""
    for venv in (os.environ.get("EGRESS_HARBOR_VENV"), str(REPO / ".venv-harbor")):
        if venv and _ready(Path(venv)):
            return Path(venv)
    venv = run_dir / "venv-harbor"
    if not _ready(venv):
        create(venv)
    return venv

"""verifiers and inspect-ai, each in a Python 3.11 venv of the tests' own (their pinned
dependencies never meet ours).

`./dev.sh test` creates them under `.venv-frameworks/` before pytest starts and exports
`EGRESS_VERIFIERS_VENV` / `EGRESS_INSPECT_VENV`; without them, the first test that needs one
creates it under the run's temporary directory (a PyPI install of about a minute). Nothing
else is fetched at run time.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PINS = {"verifiers": "verifiers==0.4.0", "inspect": "inspect-ai==0.3.285"}
DISTS = {"verifiers": "verifiers", "inspect": "inspect-ai"}


def _ready(venv: Path, name: str) -> bool:
    python = venv / "bin" / "python"
    if not python.exists():
        return False
    probe = subprocess.run(
        [str(python), "-c", f"import importlib.metadata as m; print(m.version({DISTS[name]!r}))"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return probe.returncode == 0 and probe.stdout.strip() == PINS[name].split("==")[1]


def create(venv: Path, name: str) -> None:
    """The framework at its pinned version and this repository (editable) in one resolve:
    our integration modules run in the framework's own process, as after
    `pip install 'egress-netcut[verifiers]'`."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
           "--disable-pip-version-check"]  # fmt: skip
    subprocess.run([*pip, PINS[name], "-e", str(REPO)], check=True, timeout=1800)


def framework_venv(name: str, run_dir: Path) -> Path:
    """A venv with framework `name` (`verifiers` or `inspect`) at its pinned version."""
    env = os.environ.get(f"EGRESS_{name.upper()}_VENV")
    for venv in (env, str(REPO / ".venv-frameworks" / name)):
        if venv and _ready(Path(venv), name):
            return Path(venv)
    venv = run_dir / f"venv-{name}"
    if not _ready(venv, name):
        create(venv, name)
    return venv


INSPECT_HARBOR = ("inspect-ai==0.3.285", "inspect-harbor==1.0.0")


def _inspect_harbor_ready(venv: Path) -> bool:
    python = venv / "bin" / "python"
    if not python.exists():
        return False
    names = [pin.split("==")[0] for pin in INSPECT_HARBOR]
    probe = subprocess.run(
        [
            str(python),
            "-c",
            f"import importlib.metadata as m; print([m.version(n) for n in {names!r}])",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    want = [pin.split("==")[1] for pin in INSPECT_HARBOR]
    return probe.returncode == 0 and probe.stdout.strip() == repr(want)


def inspect_harbor_venv(run_dir: Path) -> Path:
    """A Python 3.12 venv with inspect-ai and inspect-harbor at their pins and this checkout:
    `EGRESS_INSPECT_HARBOR_VENV` (dev.sh `inspect_harbor_setup`), the repository's
    `.venv-frameworks/inspect-harbor`, or a new one under `run_dir`."""
    from .harborvenv import python312

    env = os.environ.get("EGRESS_INSPECT_HARBOR_VENV")
    for venv in (env, str(REPO / ".venv-frameworks" / "inspect-harbor")):
        if venv and _inspect_harbor_ready(Path(venv)):
            return Path(venv)
    venv = run_dir / "venv-inspect-harbor"
    if not _inspect_harbor_ready(venv):
        subprocess.run([python312(), "-m", "venv", str(venv)], check=True, timeout=300)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
               "--disable-pip-version-check"]  # fmt: skip
        subprocess.run([*pip, *INSPECT_HARBOR, "-e", str(REPO)], check=True, timeout=1800)
    return venv

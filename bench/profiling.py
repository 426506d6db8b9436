"""`--profile`: py-spy flame graphs of a Python proxy while it is under load.

py-spy (installed ad hoc: `.venv/bin/pip install py-spy`; not a project dependency) samples the
proxy process from outside, pinned to the load core so the proxy keeps its own. `--nonblocking`
does not pause the proxy to sample it, so the figures of a profiled run stay close to an
unprofiled one; they are still marked `profiled` in the results. See bench/profile.md.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from bench.proxies import LOAD_CPU, pinned

SAMPLE_RATE = 250  # Hz: enough for a 3 s run, cheap for the sampler


def py_spy() -> str | None:
    local = Path(sys.executable).with_name("py-spy")
    return str(local) if local.exists() else shutil.which("py-spy")


@contextlib.contextmanager
def recording(pid: int | None, seconds: int, out: Path) -> Iterator[Path | None]:
    """Samples pid (and its subprocesses) for `seconds` while the body runs the load."""
    exe = py_spy()
    if pid is None or exe is None:
        yield None
        return
    argv = [exe, "record", "--pid", str(pid), "--duration", str(seconds)]
    argv += ["--rate", str(SAMPLE_RATE), "--nonblocking", "--subprocesses", "--output", str(out)]
    proc = subprocess.Popen(
        pinned(argv, LOAD_CPU), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        yield out
    finally:
        try:
            _, err = proc.communicate(timeout=seconds + 30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        if proc.returncode != 0:
            print(f"bench: py-spy failed: {err.decode()[-300:]}", file=sys.stderr)

"""The caller's privilege check reads its effective capabilities by capget(2)
(netcut/safety.py): the same mask /proc/self/status shows, and a process without
CAP_NET_ADMIN/CAP_SYS_ADMIN is told so (PrivilegeError) before anything is asked of a
worker."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from netcut import safety


def test_capget_reads_the_mask_proc_shows() -> None:
    assert safety.own_effective_caps() == int(safety._status_fields("self")["CapEff"], 16)


CHECK = """
from netcut import safety
from netcut.errors import PrivilegeError
mask = safety.own_effective_caps()
assert mask == int(safety._status_fields("self")["CapEff"], 16), mask
try:
    safety.require_privilege()
except PrivilegeError as exc:
    print("refused:", exc)
else:
    print("allowed")
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv"
)
@pytest.mark.parametrize(
    ("caps", "want"),
    [
        ("-all", "refused"),
        ("-all,+net_admin", "refused"),
        ("-all,+net_admin,+sys_admin", "allowed"),
    ],
)
def test_a_caller_without_the_capabilities_is_refused(caps: str, want: str) -> None:
    argv = ["setpriv", f"--inh-caps={caps}", f"--ambient-caps={caps}", f"--bounding-set={caps}"]
    argv += ["--", sys.executable, "-c", CHECK]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.startswith(want), out

"""The privilege rail counts the bounding set (real processes in a real namespace).

A non-root process with empty effective and permitted sets but NET_RAW in its bounding set
regains NET_RAW by running a file-capability binary (`setcap cap_net_raw+ep`), so the cut
must refuse it and name the process, the capability and the set; with the bounding set
dropped, or no_new_privs set (execve then grants nothing), the cut goes ahead.
"""

from __future__ import annotations

import os
import subprocess

import pytest
from netcut_testlib import Topology, wait_for

import netcut

pytestmark = pytest.mark.netns

NOBODY = ["--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"]


def _fields(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return {k: v.strip() for k, _, v in (line.partition(":") for line in f)}


def _settled(pid: int, ns: str) -> bool:
    """The process has entered `ns` and dropped to nobody (setpriv exec'd sleep)."""
    try:
        same = os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(f"/run/netns/{ns}").st_ino
        return same and _fields(pid).get("Name") == "sleep"
    except OSError:
        return False


def _run(ns: str, *setpriv: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["ip", "netns", "exec", ns, "setpriv", *setpriv, "--", "sleep", "60"])


def test_net_raw_in_the_bounding_set_alone_is_refused(topo: Topology) -> None:
    proc = _run(topo.sandbox, *NOBODY, "--bounding-set=-all,+net_raw")
    try:
        assert wait_for(lambda: _settled(proc.pid, topo.sandbox))
        fields = _fields(proc.pid)
        assert int(fields["CapEff"], 16) == 0
        assert int(fields["CapPrm"], 16) == 0
        assert int(fields["CapBnd"], 16) == 1 << 13
        with pytest.raises(netcut.UnsafeTarget) as info:
            netcut.cut(topo.sandbox, [topo.proxy])
        assert info.value.findings == (f"pid {proc.pid} (sleep): CAP_NET_RAW (bounding)",)
        assert "--allow-privileged" in str(info.value)
        assert netcut.status(topo.sandbox).state == "not cut"
        assert netcut.cut(topo.sandbox, [topo.proxy], allow_privileged=True).changed
    finally:
        proc.kill()
        proc.wait()


def test_full_bounding_set_names_every_capability(topo: Topology) -> None:
    proc = _run(topo.sandbox, *NOBODY)
    try:
        assert wait_for(lambda: _settled(proc.pid, topo.sandbox))
        with pytest.raises(netcut.UnsafeTarget) as info:
            netcut.cut(topo.sandbox, [topo.proxy])
        (finding,) = info.value.findings
        for cap in ("CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_SYS_ADMIN"):
            assert f"{cap} (bounding)" in finding
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize(
    "extra", [["--bounding-set=-all"], ["--no-new-privs"]], ids=["bounding-dropped", "nnp"]
)
def test_no_way_back_to_the_capability_is_allowed(topo: Topology, extra: list[str]) -> None:
    proc = _run(topo.sandbox, *NOBODY, *extra)
    try:
        assert wait_for(lambda: _settled(proc.pid, topo.sandbox))
        assert netcut.cut(topo.sandbox, [topo.proxy]).changed
    finally:
        proc.kill()
        proc.wait()

"""The privilege rail counts the bounding set (real processes in a real namespace).

A non-root process with empty effective and permitted sets but NET_RAW in its bounding set
regains NET_RAW by running a file-capability binary (`setcap cap_net_raw+ep`), so the cut
must refuse it and name the process, the capability and the set; with the bounding set
dropped, or no_new_privs set (execve then grants nothing), the cut goes ahead.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import shutil
import struct
import subprocess
from collections.abc import Iterator

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
        # the async API (egress's prepare) asks its walk when called: the process is found
        with pytest.raises(netcut.UnsafeTarget):
            asyncio.run(netcut.cut_and_status_async(topo.sandbox, [topo.proxy]))
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


def set_file_caps(path: pathlib.Path, permitted: int) -> None:
    """`setcap CAPS+ep PATH` without libcap: the security.capability xattr, revision 2
    (linux/capability.h: magic | VFS_CAP_FLAGS_EFFECTIVE, then permitted and inheritable
    for the low and the high 32 capabilities)."""
    value = struct.pack("<5I", 0x02000000 | 1, permitted & 0xFFFFFFFF, 0, permitted >> 32, 0)
    os.setxattr(path, "security.capability", value)


@pytest.fixture
def file_cap_python() -> Iterator[str]:
    """A copy of the interpreter with file capability cap_net_raw+ep, executable by nobody."""
    where = pathlib.Path(f"/tmp/ncrail{os.getpid()}")
    where.mkdir(mode=0o755)
    try:
        binary = where / "python"
        shutil.copy(os.path.realpath("/usr/bin/python3"), binary)
        set_file_caps(binary, 1 << 13)  # cap_net_raw+ep
        yield str(binary)
    finally:
        shutil.rmtree(where)


RAW = "import socket; socket.socket(socket.AF_PACKET, socket.SOCK_RAW); print('raw socket')"


@pytest.mark.parametrize(
    ("bounding", "regained"),
    [("-all,+net_raw", True), ("-all", False)],
    ids=["bounding-keeps-net-raw", "bounding-dropped"],
)
def test_why_the_bounding_set_counts(file_cap_python: str, bounding: str, regained: bool) -> None:
    """The escape the rail closes: a capless nobody process opens a raw socket by executing a
    file-capability binary, exactly when its bounding set keeps NET_RAW. (A raw socket only
    opened, never sent on.)"""
    done = subprocess.run(
        ["setpriv", *NOBODY, f"--bounding-set={bounding}", "--", file_cap_python, "-c", RAW],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert (done.stdout.strip() == "raw socket") is regained, done.stderr

"""The IPv6 sysctls a state read reports (netcut/direct/kernelstate.py reads them relative to
/proc/sys/net/ipv6/conf) are the namespace's own, each as `sysctl` in the namespace shows it,
for every interface, before and after a cut and with one flipped by hand."""

from __future__ import annotations

import os

import pytest
from netcut_testlib import Topology, sh

import netcut
from netcut import api

pytestmark = pytest.mark.netns


def reported(t: Topology) -> dict[str, str]:
    fd = os.open(f"/run/netns/{t.sandbox}", os.O_RDONLY)
    try:
        return dict(api.DirectExecutor(fd).read_state((), ()).sysctls)
    finally:
        os.close(fd)


def shown(t: Topology) -> dict[str, str]:
    out = sh("ip", "netns", "exec", t.sandbox, "sysctl", "-a", "-r", r"^net\.ipv6\.conf\.")
    found = {}
    for line in out.stdout.splitlines():
        key, _, value = line.partition(" = ")
        parts = key.split(".")
        if parts[-1] in ("disable_ipv6", "accept_ra"):
            found["/".join(parts)] = value.strip()
    return found


@pytest.mark.parametrize("flip", [False, True])
def test_the_sysctls_read_are_the_namespaces_own(topo: Topology, flip: bool) -> None:
    before = reported(topo)
    assert before == shown(topo)
    assert before["net/ipv6/conf/eth0/disable_ipv6"] == "0"
    netcut.cut(topo.sandbox, [topo.proxy], probe=False)
    if flip:
        sh("ip", "netns", "exec", topo.sandbox, "sysctl", "-qw", "net.ipv6.conf.lo.accept_ra=2")
    after = reported(topo)
    assert after == shown(topo)
    assert after["net/ipv6/conf/eth0/disable_ipv6"] == "1"
    assert after["net/ipv6/conf/all/accept_ra"] == "0"
    lo = "net/ipv6/conf/lo/accept_ra"  # the cut leaves loopback's alone
    assert after[lo] == ("2" if flip else before[lo])

"""Direct mode's read of netcut's marks (what a restore reads, flow.restore) is the projection
of its whole read on a real kernel, in every state a restore meets: not cut, cut, cut and
tampered with (marked routes in other tables, one family's backstop gone, transparent mode's
redirects), and after the restore. tests/unit/test_netcut_marks.py shows that the projection
answers a restore's questions as the whole state does.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
from netcut_testlib import Topology, sh

import netcut
from netcut import api
from netcut.plan.model import NamespaceState
from netcut.plan.transparent import Redirect

pytestmark = pytest.mark.netns


def both(t: Topology) -> tuple[NamespaceState, NamespaceState]:
    fd = os.open(f"/run/netns/{t.sandbox}", os.O_RDONLY)
    try:
        ex = api.DirectExecutor(fd)
        return ex.read_marks(), ex.read_state((), ()).marks()
    finally:
        os.close(fd)


def in_ns(t: Topology, *argv: str) -> None:
    sh("ip", "netns", "exec", t.sandbox, *argv)


def nothing(t: Topology) -> None:
    pass


def marked_routes_elsewhere(t: Topology) -> None:
    in_ns(t, "ip", "route", "add", "198.18.7.0/24", "dev", "eth0", "table", "100", "proto", "110")
    in_ns(t, "ip", "route", "add", "198.18.8.0/24", "dev", "eth0", "proto", "static")
    in_ns(t, "ip", "-6", "route", "add", "2001:db8::/64", "dev", "lo", "proto", "110")


def v6_backstop_gone(t: Topology) -> None:
    in_ns(t, "ip6tables-legacy", "-D", "OUTPUT", "-j", "NETCUT")
    in_ns(t, "ip6tables-legacy", "-F", "NETCUT")
    in_ns(t, "ip6tables-legacy", "-X", "NETCUT")


@pytest.mark.parametrize("tamper", [nothing, marked_routes_elsewhere, v6_backstop_gone])
@pytest.mark.parametrize(
    ("redirect", "keep"),
    [(None, True), (None, False), (Redirect(3129, 5353), True)],
    ids=["plain", "loopback-only", "transparent"],
)
def test_read_marks_is_the_whole_reads_projection(
    topo: Topology, tamper: Callable[[Topology], None], redirect: Redirect | None, keep: bool
) -> None:
    marks, projected = both(topo)
    assert marks == projected
    assert not marks.backstop
    netcut.cut(topo.sandbox, [topo.proxy] if keep else [], probe=False, redirect=redirect)
    tamper(topo)
    marks, projected = both(topo)
    assert marks == projected
    assert marks.backstop
    assert marks.redirect == (redirect is not None)
    if tamper is marked_routes_elsewhere:
        assert len(marks.routes) >= 2
    assert bool(marks.links) == bool(marks.routes)  # links only to name marked routes
    result = netcut.restore(topo.sandbox)
    assert result.changed, result
    assert result.status.state == "not cut", result
    marks, projected = both(topo)
    assert marks == projected
    assert not marks.routes
    assert netcut.status(topo.sandbox).state == "not cut"

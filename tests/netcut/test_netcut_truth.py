"""`status` tells the truth about a tampered cut, and a second `cut` repairs it (real kernel).

Each tamper is what root in the namespace could do after the cut. The status must be
`partial` and name the difference, the second cut must answer `repaired`, status `cut`, and a
real connection to a 198.19 test host must fail again. Where the tamper opens a way out, the
test first proves it did (the status was not merely pedantic).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

import pytest
from netcut_testlib import Topology, sh, wait_for

import netcut

pytestmark = pytest.mark.netns


def in_ns(t: Topology, *argv: str) -> None:
    sh("ip", "netns", "exec", t.sandbox, *argv)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "netcut.cli", *args], capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip


def flush_and_default(t: Topology) -> None:
    in_ns(t, "iptables-legacy", "-F", "NETCUT")
    in_ns(t, "ip", "route", "add", "default", "via", t.gateway, "metric", "50")


def accept_first(t: Topology) -> None:
    in_ns(t, "iptables-legacy", "-I", "OUTPUT", "-j", "ACCEPT")


def table_and_rule(t: Topology) -> None:
    in_ns(t, "ip", "route", "add", "default", "via", t.gateway, "table", "100")
    in_ns(t, "ip", "rule", "add", "from", "all", "lookup", "100", "pref", "100")
    in_ns(t, "iptables-legacy", "-F", "NETCUT")  # so that the way out is real


def sysctl_flipped(t: Topology) -> None:
    in_ns(t, "sysctl", "-qw", "net.ipv6.conf.eth0.disable_ipv6=0")
    in_ns(t, "ip6tables-legacy", "-F", "NETCUT")


def upstream(t: Topology) -> tuple[str, int]:
    return t.upstream_ip, t.echo_port


def dns_tcp(t: Topology) -> tuple[str, int]:
    return t.gateway, 53


def peer_v6(t: Topology) -> tuple[str, int]:
    return t.peer_v6, t.echo_port


CASES: dict[str, tuple[Callable[[Topology], None], str, Callable[[Topology], tuple[str, int]]]] = {
    "flush-chain+default-metric-50": (
        flush_and_default,
        "route out not in the plan: default via",
        upstream,
    ),
    "accept-ahead-of-jump": (accept_first, "IPv4 backstop: output rule ahead of it", dns_tcp),
    "route-in-table-100+ip-rule": (
        table_and_rule,
        "policy rule leads out: 100: from all lookup 100",
        upstream,
    ),
    "ipv6-sysctl-flipped": (sysctl_flipped, "sysctl net.ipv6.conf.eth0.disable_ipv6 = 0", peer_v6),
}


@pytest.mark.parametrize("name", list(CASES), ids=list(CASES))
def test_tampered_cut_is_partial_and_a_second_cut_repairs_it(topo: Topology, name: str) -> None:
    tamper, difference, victim = CASES[name]
    t = topo
    routes = t.routes()
    netcut.cut(t.sandbox, [t.proxy])
    addr, port = victim(t)
    assert not t.reaches(addr, port)
    tamper(t)
    assert wait_for(lambda: t.reaches(addr, port)), "the tamper opened a way out"
    status = netcut.status(t.sandbox)
    assert status.state == "partial"
    assert any(d.startswith(difference) for d in status.details), status.details
    shown = cli("status", "--netns", t.sandbox, "--json")
    data = json.loads(shown.stdout)
    assert shown.returncode == 3, "partial (docs/netcut.md#exit-codes)"
    assert data["state"] == "partial"
    assert any(d.startswith(difference) for d in data["details"])
    assert cli("status", "--netns", t.sandbox).stdout.splitlines()[0] == "partial"

    again = cli("cut", "--netns", t.sandbox, "--keep", t.proxy, "--json")
    assert again.returncode == 0, again.stderr
    answer = json.loads(again.stdout)
    assert answer["result"] == "repaired"
    assert any(d.startswith(difference) for d in answer["repaired"])
    assert netcut.status(t.sandbox).state == "cut"
    assert not t.reaches(addr, port), "blocked again"
    assert t.reaches(t.gateway, t.proxy_port), "the kept proxy still answers"
    assert netcut.cut(t.sandbox, [t.proxy]).changed is False, "and now it is a cut again"

    netcut.restore(t.sandbox)
    if name == "route-in-table-100+ip-rule":
        in_ns(t, "ip", "rule", "del", "pref", "100")
    assert wait_for(lambda: t.routes() == routes), "restore puts back the state before the cut"

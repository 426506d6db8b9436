"""Test hosts in network namespaces: real kernel networking, always removed.

A `TestHost` is a namespace `egt-<pid>-<n>` joined to the root namespace by a veth pair, the
root side holding 198.18.X.1/30 and the namespace side 198.18.X.2/30 — addresses only from
198.18.0.0/17 (our slice of 198.18.0.0/15; netcut's tests use 198.19.0.0/16). Every name
carries the creating pid, so a sweep can remove what a killed run left behind.

Servers for a test host are created from the test process itself: a thread enters the
namespace only to create and bind the listening socket
(`egress.proxy.net.netns.listen_in_netns`), and the test's event loop serves it. Clients
run inside namespaces with `ip netns exec`.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

PREFIX = "egt"
_counter = itertools.count(1)


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def is_root() -> bool:
    return os.geteuid() == 0


@dataclass
class TestHost:
    """A namespace with one veth to the root namespace."""

    __test__ = False  # not a test class

    ns: str
    link_root: str
    link_ns: str
    addr_root: str
    addr_ns: str

    @property
    def path(self) -> str:
        return f"/run/netns/{self.ns}"

    def exec(self, *argv: str, **kw: object) -> subprocess.CompletedProcess[str]:
        """Run a command inside the namespace (captured, text)."""
        return subprocess.run(  # type: ignore[call-overload, no-any-return]
            ["ip", "netns", "exec", self.ns, *argv], capture_output=True, text=True, **kw
        )

    def popen(self, *argv: str, **kw: object) -> subprocess.Popen[str]:
        return subprocess.Popen(  # type: ignore[call-overload, no-any-return]
            ["ip", "netns", "exec", self.ns, *argv], text=True, **kw
        )

    def add_address(self, cidr: str) -> None:
        ip("-n", self.ns, "addr", "add", cidr, "dev", self.link_ns)

    def remove(self) -> None:
        ip("link", "del", self.link_root, check=False)
        ip("netns", "del", self.ns, check=False)


def _subnet(index: int) -> tuple[str, str]:
    """The /30 number `index` inside 198.18.0.0/17 (8192 of them)."""
    k = index % 8192
    third, fourth = divmod(k * 4, 256)
    return f"198.18.{third}.{fourth + 1}", f"198.18.{third}.{fourth + 2}"


def create_test_host() -> TestHost:
    pid = os.getpid()
    n = next(_counter)
    ns = f"{PREFIX}-{pid}-{n}"
    tag = f"{pid % 100000}x{n}"
    host = TestHost(ns, f"egr{tag}", f"egn{tag}", *_subnet(pid * 37 + n))
    try:
        ip("netns", "add", ns)
        ip("link", "add", host.link_root, "type", "veth", "peer", "name", host.link_ns)
        ip("link", "set", host.link_ns, "netns", ns)
        ip("addr", "add", f"{host.addr_root}/30", "dev", host.link_root)
        ip("link", "set", host.link_root, "up")
        ip("-n", ns, "link", "set", "lo", "up")
        ip("-n", ns, "addr", "add", f"{host.addr_ns}/30", "dev", host.link_ns)
        ip("-n", ns, "link", "set", host.link_ns, "up")
        ip("-n", ns, "route", "add", "default", "via", host.addr_root)
    except BaseException:
        host.remove()
        raise
    return host


@contextlib.contextmanager
def test_host() -> Iterator[TestHost]:
    host = create_test_host()
    try:
        yield host
    finally:
        host.remove()


# Namespaces the test sessions make, each name carrying the pid of the session that made it:
# test hosts (egt-PID-N, and egt-PID-docs of test_docs_example.py) and the documentation
# examples' namespaces (docex-PID-N, test_doc_examples_root.py).
_NAMESPACES = re.compile(rf"(?:{PREFIX}|docex)-(\d+)-\w+")


def leftovers(pid: int | None = None) -> list[str]:
    """Namespaces and links of ours (of `pid`, or of any dead pid) still present."""
    found: list[str] = []
    names = ip("netns", "list", check=False).stdout.split()
    links = re.findall(r"^\d+: (eg[rn]\d+x\d+)[@:]", ip("-o", "link").stdout, re.M)
    for name in names:
        m = _NAMESPACES.fullmatch(name)
        if m and _mine_or_dead(int(m.group(1)), pid):
            found.append(name)
    for link in links:
        m = re.fullmatch(r"eg[rn](\d+)x\d+", link)
        if m and _mine_or_dead(int(m.group(1)), pid, modulo=True):
            found.append(link)
    return found


def _mine_or_dead(owner: int, pid: int | None, modulo: bool = False) -> bool:
    if pid is not None:
        return owner == (pid % 100000 if modulo else pid)
    if modulo:
        return False  # a truncated pid cannot be checked for liveness
    return not os.path.exists(f"/proc/{owner}")


def sweep(pid: int | None = None) -> None:
    """Remove leftovers of `pid` (or of dead runs): namespaces, links, safety nets."""
    for name in leftovers(pid):
        if _NAMESPACES.fullmatch(name):
            ip("netns", "del", name, check=False)
        else:
            ip("link", "del", name, check=False)
    if pid is None:
        sweep_safety_nets()


SAFETY_NET = "198.18.0.0/15"
# The routing protocol number a session's safety net carries, to tell it from any other
# prohibit route (one a machine's administrator made for the same range, say): no routing
# daemon uses it (/etc/iproute2/rt_protos), and only these routes have it.
SAFETY_PROTO = "245"


def _safety_route(owner: int, net: str = SAFETY_NET) -> tuple[str, ...]:
    return ("prohibit", net, "proto", SAFETY_PROTO, "metric", str(owner))


def stale_safety_nets(net: str = SAFETY_NET) -> list[int]:
    """The sessions (their PIDs, the routes' metrics) whose safety net is still in place
    though the session is gone: killed, it never removed its route."""
    shown = ip("-j", "route", "show", "type", "prohibit", net, "proto", SAFETY_PROTO, check=False)
    owners = [r.get("metric", 0) for r in json.loads(shown.stdout or "[]")]
    return sorted(o for o in owners if o and not os.path.exists(f"/proc/{o}"))


def sweep_safety_nets(net: str = SAFETY_NET) -> None:
    """Remove the safety nets of sessions that are gone, and no other route."""
    for owner in stale_safety_nets(net):
        ip("route", "del", *_safety_route(owner, net), check=False)


@contextlib.contextmanager
def safety_net(net: str = SAFETY_NET) -> Iterator[bool]:
    """A `prohibit 198.18.0.0/15` route in the root namespace while tests run.

    Test hosts' connected /30 routes are more specific and still win; a packet to any other
    198.18/15 address fails locally instead of following the default route off the machine.

    Each test session adds a route of its own (its metric is the session's PID, its protocol
    SAFETY_PROTO) and removes only that one: with one shared route, a session that found it
    already there relied on it, and the session that had added it removed it when it ended, in
    the middle of the other's run (test_stray_benchmark_address_fails_locally then failed,
    depending on which ended first). A killed session cannot remove its route: the next
    session's `sweep()` does, once that PID is gone.
    """
    mine = _safety_route(os.getpid(), net)
    added = ip("route", "add", *mine, check=False).returncode == 0
    try:
        yield added
    finally:
        if added:
            ip("route", "del", *mine, check=False)


@dataclass
class Link:
    """A veth pair joining two test hosts directly (a /30 of its own)."""

    a: TestHost
    b: TestHost
    addr_a: str
    addr_b: str
    name_a: str


def link(a: TestHost, b: TestHost) -> Link:
    """Join `a` and `b` with their own veth pair: `a` reaches `b` at `addr_b` directly.

    Removed with either namespace. Lets one test host reach another without routing through
    the root namespace (whose forwarding settings tests never touch).
    """
    n = next(_counter)
    tag = f"{os.getpid() % 100000}x{n}"
    addr_a, addr_b = _subnet(os.getpid() * 37 + n)
    name_a, name_b = f"egl{tag}", f"egm{tag}"
    ip("link", "add", name_a, "netns", a.ns, "type", "veth", "peer", "name", name_b, "netns", b.ns)
    ip("-n", a.ns, "addr", "add", f"{addr_a}/30", "dev", name_a)
    ip("-n", b.ns, "addr", "add", f"{addr_b}/30", "dev", name_b)
    ip("-n", a.ns, "link", "set", name_a, "up")
    ip("-n", b.ns, "link", "set", name_b, "up")
    return Link(a, b, addr_a, addr_b, name_a)

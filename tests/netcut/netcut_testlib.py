"""Helpers for netcut's real-namespace tests (fixtures live in conftest.py)."""

from __future__ import annotations

import itertools
import os
import re
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

_counter = itertools.count(1)


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(args)}: {done.stderr.strip()}")
    return done


def unique(prefix: str) -> str:
    name = f"nc{prefix}{os.getpid() % 100000}x{next(_counter)}"
    assert len(name) <= 15, name
    return name


def sysctl(ns: str, key: str, value: str) -> None:
    sh("ip", "netns", "exec", ns, "sh", "-c", f"echo {value} > /proc/sys/{key}")


def ns_socket(
    ns: str, family: int = socket.AF_INET, kind: int = socket.SOCK_STREAM
) -> socket.socket:
    """A socket created inside namespace `ns` (pyroute2 forks a child for it; flags=0 so a
    missing namespace is an error, not silently created)."""
    from pyroute2.netns import create_socket

    return create_socket(f"/run/netns/{ns}", family, kind, flags=0)


class Servers:
    """Tiny TCP echo / UDP+TCP 'DNS' servers in namespaces, served by daemon threads."""

    def __init__(self) -> None:
        self.socks: list[socket.socket] = []

    def tcp_echo(self, ns: str, addr: str, port: int, family: int = socket.AF_INET) -> None:
        srv = ns_socket(ns, family)
        self.socks.append(srv)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            srv.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        srv.bind((addr, port))
        srv.listen(64)
        threading.Thread(target=self._accept, args=(srv,), daemon=True).start()

    def udp_echo(self, ns: str, addr: str, port: int) -> None:
        srv = ns_socket(ns, socket.AF_INET, socket.SOCK_DGRAM)
        self.socks.append(srv)
        srv.bind((addr, port))
        threading.Thread(target=self._udp, args=(srv,), daemon=True).start()

    def _accept(self, srv: socket.socket) -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn: socket.socket) -> None:
        with conn:
            try:
                while data := conn.recv(65536):
                    conn.sendall(data)
            except OSError:
                return

    @staticmethod
    def _udp(srv: socket.socket) -> None:
        while True:
            try:
                data, peer = srv.recvfrom(2048)
                if peer is None:  # shut down
                    return
                srv.sendto(data, peer)
            except OSError:
                return

    def close(self) -> None:
        for s in self.socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


@dataclass
class Topology:
    host: str
    sandbox: str
    peer: str
    upstream: str
    gateway: str
    sandbox_ip: str
    peer_ip: str
    upstream_ip: str
    proxy_port: int = 3128
    echo_port: int = 7000
    peer_v6: str = ""
    servers: Servers = field(default_factory=Servers)

    @property
    def proxy(self) -> str:
        return f"{self.gateway}:{self.proxy_port}"

    def connect(self, addr: str, port: int, timeout: float = 2.0) -> socket.socket:
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        sock = ns_socket(self.sandbox, family)
        try:
            sock.settimeout(timeout)
            if family == socket.AF_INET6:
                sock.connect((addr, port, 0, ifindex_in(self.sandbox, "eth0")))
            else:
                sock.connect((addr, port))
        except BaseException:
            sock.close()
            raise
        return sock

    def reaches(self, addr: str, port: int, timeout: float = 1.0) -> bool:
        """A TCP round trip from the sandbox: connect, send, read the echo."""
        try:
            with self.connect(addr, port, timeout) as sock:
                sock.sendall(b"ping")
                return sock.recv(4) == b"ping"
        except OSError:
            return False

    def udp_reaches(self, addr: str, port: int, timeout: float = 0.5) -> bool:
        sock = ns_socket(self.sandbox, socket.AF_INET, socket.SOCK_DGRAM)
        with sock:
            sock.settimeout(timeout)
            try:
                sock.sendto(b"q", (addr, port))
                return sock.recv(16) == b"q"
            except OSError:
                return False

    def routes(self) -> str:
        v4 = sh("ip", "-n", self.sandbox, "-4", "route", "show", "table", "all").stdout
        v6 = sh("ip", "-n", self.sandbox, "-6", "route", "show", "table", "all").stdout
        return v4 + v6


def ifindex_in(ns: str, dev: str) -> int:
    out = sh("ip", "-n", ns, "-o", "link", "show", "dev", dev).stdout
    return int(out.split(":", 1)[0])


_subnet = itertools.count(os.getpid() % 200)


def next_subnet() -> int:
    """N of this topology's 198.19.N.0/24 (N in 10..249; pid-based so concurrent runs differ)."""
    return 10 + next(_subnet) % 240


def veth(ns: str, name: str, other: str) -> None:
    """A veth pair made inside `ns` whose peer, `eth0`, is moved straight into `other`."""
    sh("ip", "-n", ns, "link", "add", name, "type", "veth", "peer", "name", "eth0", "netns", other)


def link_local(ns: str, dev: str) -> str:
    out = sh("ip", "-n", ns, "-6", "addr", "show", "dev", dev, "scope", "link").stdout
    match = re.search(r"inet6 (fe80::[0-9a-f:]+)/64", out)
    assert match, out
    return match.group(1)


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    """Poll with a deadline (no sleeping as synchronization)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def legacy_tables(names: str) -> list[str]:
    """Legacy xtables tables registered in this process's namespace (reading registers none)."""
    try:
        with open(f"/proc/self/net/{names}") as f:
            return sorted(f.read().split())
    except FileNotFoundError:
        return []


def root_snapshot() -> dict[str, list[str]]:
    """What the suite must not change in the machine's root namespace: routes (v4, v6, all
    tables), forwarding, and netfilter (legacy and nft)."""
    snap: dict[str, list[str]] = {"links": sorted(name for _, name in socket.if_nameindex())}
    for fam in ("-4", "-6"):
        out = sh("ip", fam, "route", "show", "table", "all", check=False).stdout
        # "linkdown" flips with a link's carrier (another engineer's container bridge gaining
        # or losing its last port): a state of the link, not a change of the route.
        snap[f"routes{fam}"] = sorted(line.replace(" linkdown", "") for line in out.splitlines())
    for key in ("net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding"):
        with open(f"/proc/sys/{key}") as f:
            snap[key] = [f.read().strip()]
    for tool, names in (("iptables-legacy-save", "ip_tables_names"),
                        ("ip6tables-legacy-save", "ip6_tables_names")):  # fmt: skip
        snap[names] = legacy_tables(names)
        snap[tool] = []
        for table in snap[names]:  # only tables that exist: saving "all" would register them
            out = sh(tool, "-t", table, check=False).stdout
            snap[tool] += [line for line in out.splitlines() if not line.startswith(("#", ":"))]
    out = sh("iptables-save", check=False).stdout  # nft: reading creates nothing
    snap["iptables-save"] = [line for line in out.splitlines() if not line.startswith(("#", ":"))]
    return snap


# The links test sessions make: tests/harness.py's test hosts (egr/egn/egl/egm), the engine
# tests' (ncct, ncbh), netcut_testlib.unique()'s (nc...).
TEST_LINK = re.compile(r"(eg[lmnr]|nc)[a-z]*[0-9]")


def root_changes(before: dict[str, list[str]], after: dict[str, list[str]]) -> list[str]:
    """Keys that differ. Other engineers' concurrent test hosts (198.18.0.0/15 and links that
    exist in only one snapshot) come and go on their own and are left out."""
    stable_links = set(before["links"]) & set(after["links"])

    def mine(line: str) -> bool:
        if "198.18." in line or "198.19." in line:
            return False
        # The kernel adds a link's IPv6 link-local address (and its routes) some time after
        # the link comes up: another session's test host, up in both snapshots, may get it
        # in between. Nothing netcut does in a namespace makes one appear in the root's.
        if "fe80::" in line and "proto kernel" in line:
            return False
        dev = re.search(r"\bdev (\S+)", line)
        if dev is not None and TEST_LINK.match(dev.group(1)):
            # a test link (this suite's names, made by any session on the machine): the
            # kernel's routes on it (IPv6 multicast, link-local) appear when it comes up,
            # which may be between the snapshots even when the link is in both
            return False
        return dev is None or dev.group(1) in stable_links

    changed = []
    for key in before:
        old = [x for x in before[key] if mine(x)]
        new = [x for x in after[key] if mine(x)]
        if key != "links" and old != new:
            gone, came = sorted(set(old) - set(new)), sorted(set(new) - set(old))
            changed.append(f"{key}: gone {gone} came {came}")
    return changed

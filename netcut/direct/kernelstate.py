"""Read a namespace's state into model.NamespaceState. Runs *inside* the namespace.

Call these only from a process that has entered the target namespace (worker.run_in_netns):
an `Rtnl` (direct/rtnl.py) opened there talks to that namespace's netlink, /proc/sys/net shows its
sysctls, and the netfilter backend opens its tables. Nothing here opens a namespace by name, so
nothing can be created by accident (pyroute2 creates a missing named namespace unless told
flags=0).
"""

from __future__ import annotations

import errno
import os
import socket
from typing import Any

from netcut.direct.rtnl import NetlinkError, Rtnl
from netcut.errors import InvalidInput
from netcut.netfilter import Netfilter
from netcut.plan.model import (
    AF_INET,
    AF_INET6,
    NETCUT_PROTO,
    Addr,
    Keep,
    Link,
    Lookup,
    NamespaceState,
    PolicyRule,
    Route,
)

LOOPBACK_INDEX = 1
# This thread's namespace's /proc/net: /proc/self/net shows the namespace of the process's
# main thread, which is not the one entered when another thread did the entering (Linux
# 3.17+ has thread-self; before it, the worker's one thread is its main thread).
PROC_NET = "/proc/thread-self/net" if os.path.exists("/proc/thread-self") else "/proc/self/net"
_SYSCTL_NAMES = ("disable_ipv6", "accept_ra")
_CONF = "net/ipv6/conf"


def read_state(
    rt: Rtnl,
    netfilter: Netfilter,
    keeps: tuple[Keep, ...] = (),
    nameservers: tuple[str, ...] = (),
    *,
    verify: bool = False,
) -> NamespaceState:
    """Links, addresses, routes (v4+v6, all tables), IPv6 sysctls, route lookups for the
    kept addresses, and which families hold the backstop. With `verify` (status, and a
    cut of a namespace that has a record) also the policy rules and the backstop's rules and
    hook, which a first cut's planning does not need (docs/netcut.md#status)."""
    links = read_links()
    names = {link.index: link.name for link in links}
    addrs = tuple(_addr(m, names) for m in rt.dump_addrs())
    routes = tuple(
        _route(m, names, strict=not verify)
        for m in rt.dump_routes()
        if m["family"] in (AF_INET, AF_INET6)
    )
    families, filters, redirect = netfilter.read(verify)
    return NamespaceState(
        links=links,
        addrs=addrs,
        routes=routes,
        sysctls=read_sysctls(links),
        nameservers=nameservers,
        lookups=tuple(_lookup(rt, str(k.addr), names) for k in keeps if not k.is_loopback),
        backstop=families,
        redirect=redirect,
        filters=filters,
        policy_rules=tuple(_rule(m) for m in rt.dump_rules()) if verify else None,
    )


def read_marks(rt: Rtnl, netfilter: Netfilter) -> NamespaceState:
    """`read_state(...).marks()` read directly: the routes netcut marked (every table) with
    the links that name them (none are listed without such a route: a loopback-only cut
    has none), which families hold the backstop, and the redirects; what a restore needs
    (docs/netcut.md#idempotency-status-restore). No addresses, sysctls or policy rules,
    and only the marked routes are decoded."""
    marked = [
        m
        for m in rt.dump_routes()
        if m["family"] in (AF_INET, AF_INET6) and m["proto"] == NETCUT_PROTO
    ]
    links = read_links() if marked else ()
    names = {link.index: link.name for link in links}
    routes = tuple(_route(m, names, strict=False) for m in marked)
    families, _, redirect = netfilter.read(False)
    return NamespaceState(
        links=links, addrs=(), routes=routes, backstop=families, redirect=redirect
    )


def _rule(msg: Any) -> PolicyRule:
    """An `ip rule` with the selectors that matter for reading it back in a status line."""
    parts = []
    for attr, word, length in (("FRA_SRC", "from", "src_len"), ("FRA_DST", "to", "dst_len")):
        value = msg.get_attr(attr)
        if value is not None:
            parts.append(f"{word} {value}/{msg[length]}")
    for attr, word in (("FRA_IIFNAME", "iif"), ("FRA_OIFNAME", "oif"), ("FRA_FWMARK", "fwmark")):
        value = msg.get_attr(attr)
        if value is not None:
            parts.append(f"{word} {value}")
    return PolicyRule(
        family=msg["family"],
        priority=msg.get_attr("FRA_PRIORITY") or 0,
        table=msg.get_attr("FRA_TABLE") or msg["table"],
        action=msg["action"],
        selector=" ".join(parts) or "from all",
    )


def read_links() -> tuple[Link, ...]:
    """Interfaces of this process's namespace. if_nameindex() is ~100x cheaper than a netlink
    link dump decoded by pyroute2; the loopback is always ifindex 1 in a namespace."""
    return tuple(
        Link(index, name, index == LOOPBACK_INDEX) for index, name in socket.if_nameindex()
    )


def _addr(msg: Any, names: dict[int, str]) -> Addr:
    return Addr(
        family=msg["family"],
        address=msg.get_attr("IFA_ADDRESS"),
        prefixlen=msg["prefixlen"],
        index=msg["index"],
        ifname=names.get(msg["index"], str(msg["index"])),
        flags=msg.get_attr("IFA_FLAGS") or msg["flags"],
        scope=msg["scope"],
    )


def _route(msg: Any, names: dict[int, str], strict: bool = True) -> Route:
    """A route as netcut records it. A multipath route cannot be recorded (a cut refuses it);
    for verification (`strict` False) it is read with no single interface, which counts as a
    way out (docs/netcut.md#status)."""
    if strict and msg.get_attr("RTA_MULTIPATH") is not None:
        raise InvalidInput("the namespace has a multipath route; netcut cannot record it")
    oif = msg.get_attr("RTA_OIF")
    metrics = msg.get_attr("RTA_METRICS")
    return Route(
        family=msg["family"],
        dst=msg.get_attr("RTA_DST"),
        dst_len=msg["dst_len"],
        oif=oif,
        ifname=names.get(oif) if oif is not None else None,
        table=msg.get_attr("RTA_TABLE") or msg["table"],
        type=msg["type"],
        gateway=msg.get_attr("RTA_GATEWAY"),
        proto=msg["proto"],
        scope=msg["scope"],
        prefsrc=msg.get_attr("RTA_PREFSRC"),
        priority=msg.get_attr("RTA_PRIORITY"),
        tos=msg["tos"],
        flags=msg["flags"] & 0xFF,
        pref=msg.get_attr("RTA_PREF"),
        metrics=tuple((name, int(value)) for name, value in metrics["attrs"]) if metrics else (),
    )


def _lookup(rt: Rtnl, addr: str, names: dict[int, str]) -> Lookup:
    try:
        msg = rt.route_get(addr)
    except NetlinkError as exc:
        if exc.code in (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EACCES, errno.EINVAL):
            return Lookup(addr, None)
        raise
    oif = msg.get_attr("RTA_OIF")
    return Lookup(
        addr=addr,
        type=msg["type"],
        oif=oif,
        ifname=names.get(oif),
        gateway=msg.get_attr("RTA_GATEWAY"),
        prefsrc=msg.get_attr("RTA_PREFSRC"),
    )


def read_sysctls(links: tuple[Link, ...]) -> tuple[tuple[str, str], ...]:
    """The IPv6 sysctls a cut changes, as seen by this process's namespace.

    Each is opened relative to /proc/sys/net/ipv6/conf, opened once: on a host with
    hundreds of namespaces, looking up a whole /proc/sys path from a namespace the worker
    has just entered costs ~15 us, the path below `conf` ~6 us (ten per read). No `conf`
    (a kernel booted with ipv6.disable=1) is no sysctl."""
    try:
        conf = os.open(f"/proc/sys/{_CONF}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return ()
    found = []
    try:
        for name in ["all", "default", *(link.name for link in links)]:
            for leaf in _SYSCTL_NAMES:
                value = _read_value(f"{name}/{leaf}", conf)
                if value is not None:
                    found.append((f"{_CONF}/{name}/{leaf}", value))
    finally:
        os.close(conf)
    return tuple(found)


def _read_value(path: str, directory: int | None = None) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC, dir_fd=directory)
    except FileNotFoundError:
        return None
    try:
        return os.read(fd, 4096).decode().strip()
    finally:
        os.close(fd)


class SysctlWriter:
    """Writes this namespace's /proc/sys values for one apply: those below
    net/ipv6/conf (all a cut sets) relative to that directory, opened once at the first,
    as `read_sysctls` reads them (a whole /proc/sys path costs ~15 us to look up from a
    namespace just entered, seven writes per cut and per restore). Plain os.write."""

    def __init__(self) -> None:
        self._conf: int | None = None

    def write(self, key: str, value: str) -> None:
        head, _, leaf = key.partition(f"{_CONF}/")
        if head or not leaf:
            fd = os.open(f"/proc/sys/{key}", os.O_WRONLY | os.O_CLOEXEC)
        else:
            if self._conf is None:
                self._conf = os.open(
                    f"/proc/sys/{_CONF}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
                )
            fd = os.open(leaf, os.O_WRONLY | os.O_CLOEXEC, dir_fd=self._conf)
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)

    def close(self) -> None:
        if self._conf is not None:
            os.close(self._conf)
            self._conf = None

    def __enter__(self) -> SysctlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

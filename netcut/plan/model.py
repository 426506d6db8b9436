"""The data netcut plans with: keep entries, a namespace's state, packet rules, probe
results. Pure.

The plan's ops are changes.py.

Frozen dataclasses with readable `str`s (what `netcut cut --dry-run` prints). A `Route` carries
every attribute `ip route` shows, so a deleted route can be put back exactly. No I/O here
(tests/unit/test_netcut_imports.py checks its imports).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Literal, TypeAlias

from netcut.errors import InvalidInput, InvalidType

# is unassigned in iproute2's rt_protos and by IANA-registered routing daemons.
NETCUT_PROTO = 110

AF_INET = 2
AF_INET6 = 10
RTN_UNICAST = 1
RTN_LOCAL = 2
FR_ACT_TO_TBL = 1  # linux/fib_rules.h: a rule whose action is a table lookup
RT_TABLE_MAIN = 254
RT_TABLE_LOCAL = 255
RT_SCOPE_UNIVERSE = 0
RT_SCOPE_LINK = 253
RTNH_F_ONLINK = 4
IFA_F_NODAD = 0x02

_PROTO_NAMES = {2: "kernel", 3: "boot", 4: "static", 16: "dhcp", NETCUT_PROTO: "netcut"}
_SCOPE_NAMES = {0: "global", 200: "site", 253: "link", 254: "host", 255: "nowhere"}

Address: TypeAlias = ipaddress.IPv4Address | ipaddress.IPv6Address


# ---------------------------------------------------------------- inputs


@dataclass(frozen=True)
class Keep:
    """A destination the cut leaves reachable: an address, and optionally one TCP port."""

    addr: Address
    port: int | None = None

    def __post_init__(self) -> None:
        """Typed at construction (docs/policy.md#types): a port is an int 1-65535 or None."""
        port = self.port
        if port is not None and (isinstance(port, bool) or not isinstance(port, int)):
            raise InvalidType(f"Keep port must be an integer or None, not {port!r}")
        if port is not None and not 1 <= port <= 65535:
            raise InvalidInput(f"Keep port must be 1-65535, not {port}")

    def __str__(self) -> str:
        host = f"[{self.addr}]" if self.addr.version == 6 else str(self.addr)
        if self.port is None:
            return str(self.addr)
        return f"{host}:{self.port}"

    @property
    def family(self) -> int:
        return AF_INET6 if self.addr.version == 6 else AF_INET

    @property
    def is_loopback(self) -> bool:
        return self.addr.is_loopback


def parse_keep(text: str | Keep) -> Keep:
    """Parse `ADDR`, `ADDR:PORT`, `IPV6` or `[IPV6]:PORT`; raise InvalidInput otherwise."""
    if isinstance(text, Keep):
        return text
    raw = text.strip()
    host, port = raw, None
    if raw.startswith("["):
        end = raw.find("]")
        if end < 0 or (raw[end + 1 :] not in ("",) and not raw[end + 1 :].startswith(":")):
            raise InvalidInput(f"keep {text!r}: expected [IPV6]:PORT")
        host, rest = raw[1:end], raw[end + 1 :]
        port = _parse_port(text, rest[1:]) if rest else None
    elif raw.count(":") == 1:
        host, port_text = raw.split(":")
        port = _parse_port(text, port_text)
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        raise InvalidInput(f"keep {text!r}: not an IP address (names are not resolved)") from None
    return Keep(addr, port)


def _parse_port(original: str, text: str) -> int:
    # ASCII digits only: str.isdigit() is true for "¹" (int() then fails) and for "٨٠" (int()
    # reads 80), neither of which a user typed as a port
    if not (text.isascii() and text.isdigit()) or not 0 < int(text) < 65536:
        raise InvalidInput(f"keep {original!r}: port must be 1-65535")
    return int(text)


# ---------------------------------------------------------------- namespace state


@dataclass(frozen=True)
class Link:
    index: int
    name: str
    loopback: bool = False


@dataclass(frozen=True)
class Addr:
    family: int
    address: str
    prefixlen: int
    index: int
    ifname: str
    flags: int = 0
    scope: int = 0

    def __str__(self) -> str:
        return f"{self.address}/{self.prefixlen} dev {self.ifname}"


@dataclass(frozen=True)
class Route:
    """One kernel route with every attribute `ip route` shows, so it can be put back as it was."""

    family: int
    dst: str | None
    dst_len: int
    oif: int | None
    ifname: str | None
    table: int = RT_TABLE_MAIN
    type: int = RTN_UNICAST
    gateway: str | None = None
    proto: int = 4
    scope: int = RT_SCOPE_UNIVERSE
    prefsrc: str | None = None
    priority: int | None = None
    tos: int = 0
    flags: int = 0
    pref: int | None = None
    metrics: tuple[tuple[str, int], ...] = ()

    @property
    def key(self) -> tuple[object, ...]:
        """What the kernel treats as the same route (for EEXIST and `ip route del`)."""
        return (self.family, self.table, self.dst, self.dst_len, self.tos, self.priority)

    def ip_args(self) -> list[str]:
        """This route as `ip route` arguments (numbers for proto, table and scope)."""
        dst = "default" if self.dst is None else f"{self.dst}/{self.dst_len}"
        args = [dst]
        if self.gateway:
            args += ["via", self.gateway]
        if self.ifname:
            args += ["dev", self.ifname]
        args += ["table", str(self.table), "proto", str(self.proto), "scope", str(self.scope)]
        if self.prefsrc:
            args += ["src", self.prefsrc]
        if self.priority is not None:
            args += ["metric", str(self.priority)]
        if self.tos:
            args += ["tos", str(self.tos)]
        if self.flags & RTNH_F_ONLINK:
            args.append("onlink")
        for name, value in self.metrics:
            args += [name.removeprefix("RTAX_").lower(), str(value)]
        return args

    def __str__(self) -> str:
        dst = "default" if self.dst is None else f"{self.dst}/{self.dst_len}"
        text = f"{dst}"
        if self.gateway:
            text += f" via {self.gateway}"
        if self.ifname:
            text += f" dev {self.ifname}"
        if self.table != RT_TABLE_MAIN:
            text += f" table {self.table}"
        text += f" proto {_PROTO_NAMES.get(self.proto, self.proto)}"
        if self.scope != RT_SCOPE_UNIVERSE:
            text += f" scope {_SCOPE_NAMES.get(self.scope, self.scope)}"
        return text


@dataclass(frozen=True)
class Lookup:
    """The kernel's answer to `ip route get ADDR` for a kept address before the cut."""

    addr: str
    type: int | None  # None: no route at all
    oif: int | None = None
    ifname: str | None = None
    gateway: str | None = None
    prefsrc: str | None = None


# ---------------------------------------------------------------- packet rules


@dataclass(frozen=True)
class OutputRule:
    """One rule of the backstop, which every packet the namespace sends meets first; the
    first rule that matches decides. `verdict`: "allow", "reject" (an ICMP error) or "reset"
    (a TCP reset, so a client fails at once). The netfilter backend (docs/netcut.md#backends)
    decides how a rule is written in the kernel."""

    verdict: Literal["allow", "reject", "reset"]
    proto: Literal["tcp", "udp"] | None = None
    dst: str | None = None  # CIDR
    dport: int | None = None
    out_iface: str | None = None
    dst_local: bool = False  # only to the namespace's own addresses (transparent mode's lo)

    def __str__(self) -> str:
        parts = (self.verdict, self.proto, self.out_iface, self.dst_local, self.dst, self.dport)
        return _describe(*parts)


@dataclass(frozen=True)
class RedirectRule:
    """One rule of transparent mode's redirects (IPv4), first match wins: "pass" leaves the
    packet alone, "redirect" sends it to `to_port` on the namespace's own loopback."""

    verdict: Literal["pass", "redirect"]
    proto: Literal["tcp", "udp"] | None = None
    dst: str | None = None  # CIDR
    dport: int | None = None
    dst_local: bool = False  # loopback and the namespace's own addresses
    to_port: int | None = None

    def __str__(self) -> str:
        text = _describe(self.verdict, self.proto, None, self.dst_local, self.dst, self.dport)
        return text if self.to_port is None else f"{text} to port {self.to_port}"


def _describe(
    verdict: str,
    proto: str | None,
    out_iface: str | None,
    dst_local: bool,
    dst: str | None,
    dport: int | None,
) -> str:
    words = [verdict, *([proto] if proto else []), *([f"out {out_iface}"] if out_iface else [])]
    words += ["to local addresses"] if dst_local else []
    words += [f"to {dst}"] if dst else []
    words += [f"port {dport}"] if dport is not None else []
    return " ".join(words)


@dataclass(frozen=True)
class SeenBackstop:
    """A family's backstop as the netfilter backend read it back, in the plan's terms, for
    `status` to compare with the plan (docs/netcut.md#status). `rules` is None when the
    backstop is gone; a rule the backend cannot read as one netcut writes is None in it
    (it never equals a planned rule). `shown` holds each rule as the backend shows it, and
    `ahead` each rule that a packet meets before the backstop and that could let it out."""

    family: int
    rules: tuple[OutputRule | None, ...] | None
    shown: tuple[str, ...] = ()
    ahead: tuple[str, ...] = ()
    first: bool = True  # every packet sent meets the backstop (behind `ahead` only)


@dataclass(frozen=True)
class PolicyRule:
    """One `ip rule`: which table a lookup goes to (`action` FR_ACT_TO_TBL) and for what."""

    family: int
    priority: int
    table: int
    action: int = 1
    selector: str = "from all"

    def __str__(self) -> str:
        head = f"{self.priority}: {self.selector}"
        if self.action == FR_ACT_TO_TBL:
            return f"{head} lookup {self.table}"
        return f"{head} action {self.action}"


@dataclass(frozen=True)
class NamespaceState:
    links: tuple[Link, ...]
    addrs: tuple[Addr, ...]
    routes: tuple[Route, ...]
    sysctls: tuple[tuple[str, str], ...] = ()
    nameservers: tuple[str, ...] = ()
    lookups: tuple[Lookup, ...] = ()
    backstop: tuple[int, ...] = ()  # families that hold netcut's backstop
    # Read for `status` (plan/verify.py); None when the reader did not dump them (a plain cut's
    # planning needs neither), and then they are reported as not verified.
    filters: tuple[SeenBackstop, ...] | None = None
    policy_rules: tuple[PolicyRule, ...] | None = None
    redirect: bool = False  # the namespace holds transparent mode's redirects
    # Why the namespace's resolvers are not fully known (helper mode: an engine's address
    # translation the helper cannot read); a cut judged against such a state is "partial"
    # (docs/netcut.md#status).
    dns_unverified: tuple[str, ...] = ()

    def sysctl(self, key: str) -> str | None:
        return dict(self.sysctls).get(key)

    @property
    def has_ipv6(self) -> bool:
        """False on a kernel booted with ipv6.disable=1 (no net/ipv6 sysctls, no IPv6 netfilter)."""
        return any(key.startswith("net/ipv6/") for key, _ in self.sysctls)

    @property
    def loopback_indexes(self) -> frozenset[int]:
        return frozenset(link.index for link in self.links if link.loopback)

    @property
    def marked_routes(self) -> tuple[Route, ...]:
        return tuple(r for r in self.routes if r.proto == NETCUT_PROTO)

    def marks(self) -> NamespaceState:
        """Only netcut's marks (its routes, backstop and redirects) and the links that name
        them (none without a marked route): all that a restore plans from and judges by
        (plan_restore, and judge_status's "not cut"), so a restore reads no more than this
        (docs/netcut.md#idempotency-status-restore)."""
        marked = self.marked_routes
        return NamespaceState(
            links=self.links if marked else (),
            addrs=(),
            routes=marked,
            backstop=self.backstop,
            redirect=self.redirect,
        )


# ---------------------------------------------------------------- probe results


@dataclass(frozen=True)
class ProbeItem:
    target: str
    expect: str  # "reachable" | "blocked"
    outcome: str  # "connected" | "timeout" | an errno name such as "ECONNREFUSED"
    # a connected probe's own ADDR:PORT ("" where unknown: helper mode), by which a listener
    # tells the probe's connection from anyone else's (docs/netcut.md#probe)
    source: str = ""

    @property
    def ok(self) -> bool:
        return (self.outcome == "connected") == (self.expect == "reachable")

    def __str__(self) -> str:
        verdict = "ok" if self.ok else "FAIL"
        return f"{verdict} {self.target} expected {self.expect}: {self.outcome}"


@dataclass(frozen=True)
class ProbeResult:
    items: tuple[ProbeItem, ...]

    @property
    def ok(self) -> bool:
        return all(item.ok for item in self.items)

    def reason(self) -> str:
        """One line naming each failure and its likely cause."""
        bad = [item for item in self.items if not item.ok]
        parts = []
        for item in bad:
            hint = ""
            if item.expect == "reachable" and item.outcome == "timeout":
                hint = " (no answer: a host firewall dropping container-to-host traffic?)"
            elif item.expect == "reachable" and item.outcome == "ECONNREFUSED":
                hint = " (nothing listens there, or a firewall rejects it)"
            parts.append(f"{item.target} expected {item.expect}, got {item.outcome}{hint}")
        return "; ".join(parts)

    def lines(self) -> list[str]:
        return [str(item) for item in self.items]

"""The plan's ops: each one change `apply.py` (direct mode) or `render.py` (helper mode)
carries out, and that `plan.invert` can undo. Pure.

Frozen dataclasses with readable `str`s (what `netcut cut --dry-run` prints); `Op` is their
union. See docs/netcut.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

from netcut.model import AF_INET6, CHAIN, NAT_CHAIN, Addr, Route


@dataclass(frozen=True)
class FilterRule:
    """One backstop rule; `verdict` is ACCEPT, REJECT, or REJECT-RST (REJECT with tcp-reset)."""

    verdict: Literal["ACCEPT", "REJECT", "REJECT-RST"]
    proto: Literal["tcp", "udp"] | None = None
    dst: str | None = None  # CIDR
    dport: int | None = None
    out_iface: str | None = None
    dst_local: bool = False  # -m addrtype --dst-type LOCAL (transparent mode's narrower lo)

    def iptables_args(self) -> list[str]:
        args: list[str] = []
        if self.out_iface:
            args += ["-o", self.out_iface]
        if self.dst_local:
            args += ["-m", "addrtype", "--dst-type", "LOCAL"]
        if self.dst:
            args += ["-d", self.dst]
        if self.proto:
            args += ["-p", self.proto]
        if self.dport is not None:
            args += ["-m", self.proto or "tcp", "--dport", str(self.dport)]
        if self.verdict == "REJECT-RST":
            return [*args, "-j", "REJECT", "--reject-with", "tcp-reset"]
        return [*args, "-j", self.verdict]


@dataclass(frozen=True)
class AddBackstop:
    family: int
    rules: tuple[FilterRule, ...]

    def __str__(self) -> str:
        tool = "ip6tables" if self.family == AF_INET6 else "iptables"
        body = "; ".join(" ".join(r.iptables_args()) for r in self.rules)
        return f"{tool}: chain {CHAIN} jumped to first from OUTPUT: {body}"


@dataclass(frozen=True)
class RemoveBackstop:
    family: int

    def __str__(self) -> str:
        tool = "ip6tables" if self.family == AF_INET6 else "iptables"
        return f"{tool}: remove chain {CHAIN} and its jump from OUTPUT"


@dataclass(frozen=True)
class AddRoute:
    route: Route

    def __str__(self) -> str:
        return f"add route {self.route}"


@dataclass(frozen=True)
class DelRoute:
    route: Route

    def __str__(self) -> str:
        return f"delete route {self.route}"


@dataclass(frozen=True)
class AddAddr:
    addr: Addr

    def __str__(self) -> str:
        return f"add address {self.addr}"


@dataclass(frozen=True)
class DelAddr:
    addr: Addr

    def __str__(self) -> str:
        return f"delete address {self.addr}"


@dataclass(frozen=True)
class SetSysctl:
    key: str  # under /proc/sys, with slashes: net/ipv6/conf/eth0/disable_ipv6
    value: str
    old: str

    def __str__(self) -> str:
        return f"sysctl {self.key.replace('/', '.')} = {self.value} (was {self.old})"


@dataclass(frozen=True)
class KillFlows:
    """Destroy TCP sockets whose peer is not loopback, local, or an `allowed` (addr, port)."""

    allowed: tuple[tuple[str, int | None], ...]

    def __str__(self) -> str:
        kept = ", ".join(a if p is None else f"{a}:{p}" for a, p in self.allowed) or "none"
        return f"destroy TCP flows except loopback and {kept}"


@dataclass(frozen=True)
class NatRule:
    """One rule of the transparent-mode redirect chain (nat OUTPUT): RETURN leaves the packet
    alone, REDIRECT sends it to `to_port` on the namespace's own loopback."""

    verdict: Literal["RETURN", "REDIRECT"]
    proto: Literal["tcp", "udp"] | None = None
    dst: str | None = None  # CIDR
    dport: int | None = None
    dst_local: bool = False  # -m addrtype --dst-type LOCAL: loopback and own addresses
    to_port: int | None = None

    def iptables_args(self) -> list[str]:
        args: list[str] = []
        if self.dst:
            args += ["-d", self.dst]
        if self.dst_local:
            args += ["-m", "addrtype", "--dst-type", "LOCAL"]
        if self.proto:
            args += ["-p", self.proto]
        if self.dport is not None:
            args += ["-m", self.proto or "tcp", "--dport", str(self.dport)]
        if self.verdict == "REDIRECT":
            return [*args, "-j", "REDIRECT", "--to-ports", str(self.to_port)]
        return [*args, "-j", "RETURN"]


@dataclass(frozen=True)
class AddRedirect:
    """Transparent mode: chain NETCUT_REDIRECT in the nat table, jumped to first from OUTPUT."""

    rules: tuple[NatRule, ...]

    def __str__(self) -> str:
        body = "; ".join(" ".join(r.iptables_args()) for r in self.rules)
        return f"iptables -t nat: chain {NAT_CHAIN} jumped to first from OUTPUT: {body}"


@dataclass(frozen=True)
class RemoveRedirect:
    def __str__(self) -> str:
        return f"iptables -t nat: remove chain {NAT_CHAIN} and its jump from OUTPUT"


Op: TypeAlias = (
    AddBackstop
    | RemoveBackstop
    | AddRoute
    | DelRoute
    | AddAddr
    | DelAddr
    | SetSysctl
    | KillFlows
    | AddRedirect
    | RemoveRedirect
)

"""The plan's ops: each one change that direct/executor.py (direct mode) or helper/script.py
(helper mode) carries out, and that `planner.invert` can undo. Pure.

Frozen dataclasses with readable `str`s (what `netcut cut --dry-run` prints); `Op` is their
union. See docs/netcut.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from netcut.plan.model import AF_INET6, Addr, OutputRule, RedirectRule, Route


def _family(family: int) -> str:
    return "IPv6" if family == AF_INET6 else "IPv4"


@dataclass(frozen=True)
class AddBackstop:
    """The backstop of one family: every packet the namespace sends meets `rules` first."""

    family: int
    rules: tuple[OutputRule, ...]

    def __str__(self) -> str:
        body = "; ".join(map(str, self.rules))
        return f"{_family(self.family)} backstop, first on output: {body}"


@dataclass(frozen=True)
class RemoveBackstop:
    family: int

    def __str__(self) -> str:
        return f"remove the {_family(self.family)} backstop"


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
class AddRedirect:
    """Transparent mode (IPv4): every packet the namespace sends meets `rules` first."""

    rules: tuple[RedirectRule, ...]

    def __str__(self) -> str:
        return f"IPv4 redirects, first on output: {'; '.join(map(str, self.rules))}"


@dataclass(frozen=True)
class RemoveRedirect:
    def __str__(self) -> str:
        return "remove the redirects"


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

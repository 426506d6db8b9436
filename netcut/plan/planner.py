"""The cut as data: a namespace's state in, a plan of small operations out. Pure.

Strategy. The executor of a mode reads the namespace (netlink, sysctls, its netfilter
backend) into the frozen dataclasses of plan/model.py; `plan_cut` turns a `NamespaceState` and
the keep list into a `CutPlan`, a tuple of ops in the order they must run; `plan_restore`
turns the recorded plan (and what the namespace holds now) into the ops that undo it. Direct
mode's executor is a single dispatcher over these ops, helper mode turns the same ops into
shell commands, and how a rule is written in the kernel is the netfilter backend's
(docs/netcut.md#backends).

Order of a cut, chosen so that the namespace is never more open than before and is closed
from the first step: (1) the backstop (v4 and v6), which every packet sent meets first,
goes in first, so the moment it is in place only loopback and the kept ADDR:PORTs can be
reached; (2) /32 keep routes are added
(marked with `NETCUT_PROTO`); (3) every other unicast route outside the local table is deleted,
gateway routes before the connected routes they depend on; (4) IPv6 addresses are removed and
IPv6 disabled per interface, router advertisements ignored; (5) TCP flows to anything not kept
are destroyed. Restore runs the inverse ops in reverse order.

No I/O here (tests/unit/test_netcut_imports.py checks its imports).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from netcut.errors import InvalidInput
from netcut.plan.changes import (
    AddAddr,
    AddBackstop,
    AddRedirect,
    AddRoute,
    DelAddr,
    DelRoute,
    KillFlows,
    Op,
    RemoveBackstop,
    RemoveRedirect,
    SetSysctl,
)
from netcut.plan.model import (
    AF_INET,
    AF_INET6,
    NETCUT_PROTO,
    RT_SCOPE_LINK,
    RT_SCOPE_UNIVERSE,
    RT_TABLE_LOCAL,
    RTN_LOCAL,
    RTN_UNICAST,
    RTNH_F_ONLINK,
    Addr,
    Address,
    Keep,
    NamespaceState,
    OutputRule,
    Route,
)
from netcut.plan.transparent import (
    Redirect,
    loopback_default_route,
    redirect_rules,
    transparent_backstop,
)
from netcut.plan.verify import ipv6_sysctls


@dataclass(frozen=True)
class CutPlan:
    keeps: tuple[Keep, ...]
    ops: tuple[Op, ...]
    nameservers: tuple[str, ...] = field(default=())
    # From a record's journal (records.py): how many ops are known to have completed; None
    # for a complete cut (every op ran). Never serialized with the plan.
    applied: int | None = field(default=None, compare=False)

    def lines(self) -> list[str]:
        kept = ", ".join(str(k) for k in self.keeps) or "nothing but loopback"
        return [f"keep: {kept}", *(f"  {op}" for op in self.ops)]

    @property
    def transparent(self) -> bool:
        """Does this cut redirect traffic to a proxy (transparent mode)?"""
        return any(isinstance(op, AddRedirect) for op in self.ops)


@dataclass(frozen=True)
class RestorePlan:
    ops: tuple[Op, ...]
    complete: bool  # False when no record existed: what the cut removed cannot be put back

    def lines(self) -> list[str]:
        return [f"  {op}" for op in self.ops]


# ---------------------------------------------------------------- planning


def plan_cut(
    state: NamespaceState, keeps: tuple[Keep, ...], redirect: Redirect | None = None
) -> CutPlan:
    """Compute the ops that cut `state` down to loopback and `keeps`.

    With `redirect` (transparent mode, see plan/transparent.py), TCP and DNS are also redirected to
    the proxy's in-namespace listeners. Raises InvalidInput for a keep that cannot be
    honoured: an IPv6 address other than loopback (the cut disables IPv6), a port-53 keep
    (the DNS drop wins), or an address the namespace has no route to.
    """
    keeps = tuple(dict.fromkeys(keeps))
    _check_keeps(keeps)
    keep_routes = _keep_routes(state, keeps)
    doomed = _routes_to_delete(state)
    clashing = {r.key for r in keep_routes}
    first = [DelRoute(r) for r in doomed if r.key in clashing]
    rest = [DelRoute(r) for r in doomed if r.key not in clashing]
    families = (AF_INET, AF_INET6) if state.has_ipv6 else (AF_INET,)
    backstops = [AddBackstop(f, backstop_rules(f, keeps, state.nameservers)) for f in families]
    transparent: list[Op] = []
    if redirect is not None:
        backstops[0] = AddBackstop(AF_INET, transparent_backstop(backstops[0].rules, redirect))
        transparent = [AddRedirect(redirect_rules(redirect, keeps))]
    ops: list[Op] = [
        *backstops,
        *transparent,
        *first,
        *(AddRoute(r) for r in keep_routes),
        *rest,
        *([AddRoute(loopback_default_route(state))] if redirect is not None else []),
        *(DelAddr(a) for a in _ipv6_addrs(state)),
        *_ipv6_off(state),
        KillFlows(_allowed_flows(state, keeps)),
    ]
    return CutPlan(keeps, tuple(ops), state.nameservers)


def _check_keeps(keeps: tuple[Keep, ...]) -> None:
    for keep in keeps:
        if keep.addr.version == 6 and not keep.is_loopback:
            raise InvalidInput(
                f"keep {keep}: a cut disables IPv6 in the namespace; keep an IPv4 address"
                " or loopback"
            )
        if keep.port == 53:
            raise InvalidInput(f"keep {keep}: port 53 is always dropped (DNS)")
        if keep.addr.is_unspecified or keep.addr.is_multicast:
            raise InvalidInput(f"keep {keep}: not a unicast address")


def _keep_routes(state: NamespaceState, keeps: tuple[Keep, ...]) -> list[Route]:
    lookups = {lk.addr: lk for lk in state.lookups}
    routes: dict[str, Route] = {}
    for keep in keeps:
        addr = str(keep.addr)
        if keep.is_loopback or addr in routes:
            continue
        lookup = lookups.get(addr)
        if lookup is None or lookup.type is None or lookup.oif is None:
            raise InvalidInput(f"keep {keep}: the namespace has no route to {addr}")
        if lookup.type == RTN_LOCAL or lookup.oif in state.loopback_indexes:
            continue  # an address of the namespace itself: delivered locally
        routes[addr] = Route(
            family=AF_INET,
            dst=addr,
            dst_len=32,
            oif=lookup.oif,
            ifname=lookup.ifname,
            gateway=lookup.gateway,
            proto=NETCUT_PROTO,
            scope=RT_SCOPE_UNIVERSE if lookup.gateway else RT_SCOPE_LINK,
            prefsrc=lookup.prefsrc,
            flags=RTNH_F_ONLINK if lookup.gateway else 0,
        )
    return list(routes.values())


def _routes_to_delete(state: NamespaceState) -> list[Route]:
    """Unicast routes outside the local table that leave by a real interface."""
    loopbacks = state.loopback_indexes
    doomed = [
        r
        for r in state.routes
        if r.table != RT_TABLE_LOCAL
        and r.type == RTN_UNICAST
        and r.proto != NETCUT_PROTO
        and r.oif not in loopbacks
    ]
    # Gateway routes first: they depend on the connected routes deleted after them.
    return sorted(doomed, key=lambda r: r.gateway is None)


def _ipv6_addrs(state: NamespaceState) -> list[Addr]:
    loopbacks = state.loopback_indexes
    return [a for a in state.addrs if a.family == AF_INET6 and a.index not in loopbacks]


def _ipv6_off(state: NamespaceState) -> list[SetSysctl]:
    ops = []
    for key, value in ipv6_sysctls(state):
        old = state.sysctl(key)
        if old is not None and old != value:
            ops.append(SetSysctl(key, value, old))
    return ops


def _allowed_flows(
    state: NamespaceState, keeps: tuple[Keep, ...]
) -> tuple[tuple[str, int | None], ...]:
    local = [(a.address, None) for a in state.addrs]
    kept = [(str(k.addr), k.port) for k in keeps]
    return tuple(dict.fromkeys([*kept, *local]))


def backstop_rules(
    family: int, keeps: tuple[Keep, ...], nameservers: tuple[str, ...] = ()
) -> tuple[OutputRule, ...]:
    """The backstop for one family, first match wins.

    DNS goes first so that even a resolver on loopback (Docker's embedded 127.0.0.11, whose
    address translation rewrites the port before the backstop sees it) is refused; then
    loopback and the kept destinations are allowed; everything else is refused, TCP with a
    reset so a client fails at once instead of waiting for a timeout.
    """
    host_len = 128 if family == AF_INET6 else 32
    version = 6 if family == AF_INET6 else 4
    kept = {str(k.addr) for k in keeps}
    rules = [
        OutputRule("reject", proto="udp", dport=53),
        OutputRule("reset", proto="tcp", dport=53),
    ]
    for ns in nameservers:
        addr = _ip_or_none(ns)
        if addr and addr.version == version and addr.is_loopback and ns not in kept:
            if str(addr) not in ("127.0.0.1", "::1"):
                rules.append(OutputRule("reject", dst=f"{addr}/{host_len}"))
    rules.append(OutputRule("allow", out_iface="lo"))
    for keep in keeps:
        if keep.addr.version != version or keep.is_loopback:
            continue
        dst = f"{keep.addr}/{host_len}"
        if keep.port is None:
            rules.append(OutputRule("allow", dst=dst))
        else:
            rules.append(OutputRule("allow", proto="tcp", dst=dst, dport=keep.port))
    rules.append(OutputRule("reset", proto="tcp"))
    rules.append(OutputRule("reject"))
    return tuple(rules)


def _ip_or_none(text: str) -> Address | None:
    try:
        return ipaddress.ip_address(text.split("%")[0])
    except ValueError:
        return None


# ---------------------------------------------------------------- undo


def invert(op: Op) -> Op | None:
    """The op that undoes `op`, or None when it cannot be undone (destroyed flows)."""
    if isinstance(op, AddBackstop):
        return RemoveBackstop(op.family)
    if isinstance(op, AddRedirect):
        return RemoveRedirect()
    if isinstance(op, AddRoute):
        return DelRoute(op.route)
    if isinstance(op, DelRoute):
        return AddRoute(op.route)
    if isinstance(op, DelAddr):
        # its own flags: a restore gives back the address as it was, DAD included
        return AddAddr(op.addr)
    if isinstance(op, AddAddr):
        return DelAddr(op.addr)
    if isinstance(op, SetSysctl):
        return SetSysctl(op.key, op.old, op.value)
    if isinstance(op, RemoveBackstop | RemoveRedirect | KillFlows):
        return None
    raise RuntimeError(f"unexpected {op!r}")


def plan_restore(record: CutPlan | None, state: NamespaceState) -> RestorePlan:
    """Undo `record` (the plan of the cut, as recorded before it ran), then remove whatever
    still carries netcut's marks. Without a record only the marked additions are removed.

    A journal that says `applied` ops completed undoes those and the one after them (it may
    have completed without its line being written: every undo op is tolerant), never an op
    that did not start (docs/netcut.md#the-journal)."""
    ops: list[Op] = []
    if record is not None:
        ran = record.ops if record.applied is None else record.ops[: record.applied + 1]
        ops += [inv for op in reversed(ran) if (inv := invert(op)) is not None]
    undone = {op.route.key for op in ops if isinstance(op, DelRoute)}
    ops += [DelRoute(r) for r in state.marked_routes if r.key not in undone]
    if state.redirect and RemoveRedirect() not in ops:
        ops.append(RemoveRedirect())
    for family in state.backstop:
        if RemoveBackstop(family) not in ops:
            ops.append(RemoveBackstop(family))
    return RestorePlan(tuple(ops), complete=record is not None)

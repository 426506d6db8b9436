"""Does the namespace still hold the cut? The recorded plan's ops and the live state in, the
list of differences out. Pure.

Strategy (docs/netcut.md#status). A cut is checked as a set of invariants over the *whole*
state, not as "the keys it removed are still gone": an attacker (or a careless setup step)
with CAP_NET_ADMIN can add a route by another key, in another table, behind an `ip rule`, or
open the backstop without removing it. Each invariant answers with readable lines:

 1. backstop, per family the plan installed: it holds exactly the planned rules in order,
    and every packet sent meets it first, behind nothing that could let a packet out (what
    could is the netfilter backend's to judge when it reads its rules back);
 2. routes, every table: no unicast route (nor a broadcast/multicast one outside the local
    table) leaves by a real interface unless it is one of the plan's keep routes (same key,
    interface and gateway), and every keep route is there;
 3. policy rules: none (beyond the kernel's three defaults) leads to a table with such a route;
 4. IPv6: the sysctls the cut sets (disable_ipv6=1, accept_ra=0) hold for every interface now
    present, and no interface but loopback holds an IPv6 address;
 5. transparent mode: the redirects are present (their content is not compared: a redirect
    that stops working leaves the traffic to the backstop, which refuses it, so it can only
    close, never open; plan/transparent.py).

`repair_ops` turns the same findings into ops that bring the namespace back to the plan
without touching the record (what the tamper added is removed, never put back by restore).
No I/O here (tests/unit/test_netcut_imports.py checks its imports).
"""

from __future__ import annotations

import ipaddress

from netcut.plan.changes import (
    AddBackstop,
    AddRedirect,
    AddRoute,
    DelAddr,
    DelRoute,
    KillFlows,
    Op,
    SetSysctl,
)
from netcut.plan.model import (
    AF_INET6,
    FR_ACT_TO_TBL,
    RT_TABLE_LOCAL,
    RTN_UNICAST,
    Addr,
    NamespaceState,
    Route,
)

# The kernel's own rules (priority, table): local, main, default. Every lookup goes through
# them; a way out in `main` is already reported as a route, the rule adds nothing.
DEFAULT_RULES = frozenset({(0, 255), (32766, 254), (32767, 253)})
# linux/rtnetlink.h: RTN_BROADCAST, RTN_ANYCAST, RTN_MULTICAST
_CASTS = frozenset({3, 4, 5})


def ipv6_sysctls(state: NamespaceState) -> list[tuple[str, str]]:
    """What a cut sets: accept_ra=0 everywhere, disable_ipv6=1 on every interface but
    loopback (keeps ::1), and on `default` so an interface made later starts without IPv6."""
    wanted: list[tuple[str, str]] = [("net/ipv6/conf/all/accept_ra", "0")]
    for name in ["default", *(link.name for link in state.links if not link.loopback)]:
        wanted.append((f"net/ipv6/conf/{name}/accept_ra", "0"))
        wanted.append((f"net/ipv6/conf/{name}/disable_ipv6", "1"))
    return wanted


def differences(ops: tuple[Op, ...], state: NamespaceState) -> tuple[str, ...]:
    """Every way `state` departs from the cut planned as `ops`; empty when the cut holds."""
    found: list[str] = []
    for op in ops:
        if isinstance(op, AddBackstop):
            found += backstop_differences(op, state)
        if isinstance(op, AddRedirect) and not state.redirect:
            found.append("the redirects are gone")
    planned = _planned_routes(ops)
    found += [f"route out not in the plan: {r}{_metric(r)}" for r in leaving_routes(ops, state)]
    found += [f"keep route missing: {r}" for r in _missing_routes(planned, state)]
    found += [f"policy rule leads out: {rule}" for rule in _rules_out(ops, state)]
    for key, want, cur in _wrong_sysctls(state):
        found.append(f"sysctl {key.replace('/', '.')} = {cur} (the cut sets {want})")
    found += [f"IPv6 address {a}" for a in _ipv6_addrs(state)]
    found += dns_differences(ops, state)
    return tuple(found)


def dns_differences(ops: tuple[Op, ...], state: NamespaceState) -> list[str]:
    """The namespace's resolvers against the plan: every loopback resolver it names now
    (resolv.conf, the engine's rewrite of port 53: Docker's embedded 127.0.0.11) must be refused
    by address in the backstop of its family, since the engine's address translation moves
    the port before the backstop's port-53 rules see it (docs/netcut.md#the-plan); 127.0.0.1
    and ::1 are loopback itself, refused by port. Resolvers that could not be read at all
    are a difference too: a cut whose DNS cannot be verified is not a cut."""
    found = [f"DNS not verified: {why}" for why in state.dns_unverified]
    found += [
        f"DNS resolver {addr} (loopback: an engine's embedded DNS) not refused"
        for addr in unrefused_resolvers(ops, state)
    ]
    return found


def unrefused_resolvers(ops: tuple[Op, ...], state: NamespaceState) -> list[str]:
    """The loopback resolvers of `state` (other than 127.0.0.1 and ::1) that the backstop
    planned as `ops` does not refuse by address."""
    refused = {
        rule.dst
        for op in ops
        if isinstance(op, AddBackstop)
        for rule in op.rules
        if rule.verdict != "allow" and rule.dst and rule.proto is None and rule.dport is None
    }
    found: list[str] = []
    for ns in state.nameservers:
        try:
            addr = ipaddress.ip_address(ns.split("%", 1)[0])
        except ValueError:
            continue
        if not addr.is_loopback or str(addr) in ("127.0.0.1", "::1"):
            continue
        if f"{addr}/{addr.max_prefixlen}" not in refused:
            found.append(str(addr))
    return found


def unverified(state: NamespaceState) -> tuple[str, ...]:
    """What the state dump did not include, so `differences` could not check it."""
    missing = []
    if state.filters is None:
        missing.append("backstop rules and their place first (only the backstop's presence)")
    if state.policy_rules is None:
        missing.append("policy rules")
    return tuple(f"not verified: {m}" for m in missing)


def repair_ops(ops: tuple[Op, ...], state: NamespaceState) -> tuple[Op, ...]:
    """Ops that bring `state` back to the cut planned as `ops`: the backstop reinstalled
    first (so the namespace is closed from the first step), sysctls set, stray routes and
    addresses removed, keep routes put back, flows opened meanwhile destroyed."""
    out: list[Op] = [
        op for op in ops if isinstance(op, AddBackstop) and backstop_differences(op, state)
    ]
    if not state.redirect:
        out += [op for op in ops if isinstance(op, AddRedirect)]
    out += [SetSysctl(k, want, cur) for k, want, cur in _wrong_sysctls(state)]
    stray = leaving_routes(ops, state)
    out += [DelRoute(r) for r in sorted(stray, key=lambda r: r.gateway is None)]
    out += [AddRoute(r) for r in _missing_routes(_planned_routes(ops), state)]
    out += [DelAddr(a) for a in _ipv6_addrs(state)]
    out += [op for op in ops if isinstance(op, KillFlows)]
    return tuple(out)


# ---------------------------------------------------------------- backstop


def backstop_differences(op: AddBackstop, state: NamespaceState) -> list[str]:
    label = f"{'IPv6' if op.family == AF_INET6 else 'IPv4'} backstop"
    if op.family not in state.backstop:
        return [f"{label} is gone"]
    if state.filters is None:
        return []
    seen = next((d for d in state.filters if d.family == op.family), None)
    if seen is None or seen.rules is None:
        return [f"{label} is gone"]
    lines = [f"output rule ahead of it: {rule}" for rule in seen.ahead]
    lines += [] if seen.first else ["output does not pass through it first"]
    return [f"{label}: {line}" for line in (*lines, *_rules(op.rules, seen.rules, seen.shown))]


def _rules(
    planned: tuple[object, ...], found: tuple[object, ...], shown: tuple[str, ...]
) -> list[str]:
    if found == planned:
        return []
    for i, want in enumerate(planned):
        if i >= len(found):
            return [f"it has {len(found)} of the plan's {len(planned)} rules"]
        if found[i] != want:
            return [f"rule {i + 1} is `{shown[i]}`, the plan has `{want}`"]
    return [f"it has rules the plan does not: {'; '.join(shown[len(planned) :])}"]


# ---------------------------------------------------------------- routes and rules


def _planned_routes(ops: tuple[Op, ...]) -> list[Route]:
    return [op.route for op in ops if isinstance(op, AddRoute)]


def _route_id(r: Route) -> tuple[object, ...]:
    return (r.key, r.oif, r.gateway)


def leaving_routes(ops: tuple[Op, ...], state: NamespaceState) -> list[Route]:
    """Unicast routes, in any table, that leave by a non-loopback interface (or by no single
    one: multipath) and are not keep routes of the plan."""
    kept = {_route_id(r) for r in _planned_routes(ops)}
    loopbacks = state.loopback_indexes
    return [
        r for r in state.routes if _sends(r) and r.oif not in loopbacks and _route_id(r) not in kept
    ]


def _sends(r: Route) -> bool:
    """A route that sends packets out of an interface: unicast anywhere; broadcast, anycast
    or multicast outside the local table (where the kernel keeps its own for each address,
    which a cut leaves in place: only loopback and the kept destinations pass the backstop)."""
    return r.type == RTN_UNICAST or (r.type in _CASTS and r.table != RT_TABLE_LOCAL)


def _missing_routes(planned: list[Route], state: NamespaceState) -> list[Route]:
    present = {_route_id(r) for r in state.routes}
    return [r for r in planned if _route_id(r) not in present]


def _rules_out(ops: tuple[Op, ...], state: NamespaceState) -> list[str]:
    tables = {r.table for r in leaving_routes(ops, state)}
    return [
        str(rule)
        for rule in state.policy_rules or ()
        if rule.action == FR_ACT_TO_TBL
        and rule.table in tables
        and (rule.priority, rule.table) not in DEFAULT_RULES
    ]


def _metric(r: Route) -> str:
    return f" metric {r.priority}" if r.priority is not None else ""


# ---------------------------------------------------------------- IPv6


def _wrong_sysctls(state: NamespaceState) -> list[tuple[str, str, str]]:
    if not state.has_ipv6:
        return []
    out = []
    for key, want in ipv6_sysctls(state):
        current = state.sysctl(key)
        if current is not None and current != want:
            out.append((key, want, current))
    return out


def _ipv6_addrs(state: NamespaceState) -> list[Addr]:
    loopbacks = state.loopback_indexes
    return [a for a in state.addrs if a.family == AF_INET6 and a.index not in loopbacks]

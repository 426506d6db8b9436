"""Does the namespace still hold the cut? The recorded plan's ops and the live state in, the
list of differences out. Pure.

Strategy (docs/netcut.md#status). A cut is checked as a set of invariants over the *whole*
state, not as "the keys it removed are still gone": an attacker (or a careless setup step)
with CAP_NET_ADMIN can add a route by another key, in another table, behind an `ip rule`, or
open the backstop without removing it. Each invariant answers with readable lines:

 1. backstop, per family the plan installed: chain NETCUT holds exactly the planned rules in
    order, and OUTPUT jumps to it with nothing but DROP/REJECT ahead of the jump;
 2. routes, every table: no unicast route (nor a broadcast/multicast one outside the local
    table) leaves by a real interface unless it is one of the plan's keep routes (same key,
    interface and gateway), and every keep route is there;
 3. policy rules: none (beyond the kernel's three defaults) leads to a table with such a route;
 4. IPv6: the sysctls the cut sets (disable_ipv6=1, accept_ra=0) hold for every interface now
    present, and no interface but loopback holds an IPv6 address;
 5. transparent mode: chain NETCUT_REDIRECT is present in the nat table (its content is not
    compared: a redirect that stops working leaves the traffic to the backstop, which drops
    it, so it can only close, never open; redirect.py).

`repair_ops` turns the same findings into ops that bring the namespace back to the plan
without touching the record (what the tamper added is removed, never put back by restore).
No I/O here: this module imports neither socket, asyncio, pyroute2 nor iptc.
"""

from __future__ import annotations

import ipaddress
from typing import Literal, TypeAlias

from netcut.model import (
    AF_INET6,
    CHAIN,
    FR_ACT_TO_TBL,
    NAT_CHAIN,
    RT_TABLE_LOCAL,
    RTN_UNICAST,
    Addr,
    FilterDump,
    NamespaceState,
    Route,
    SeenRule,
)
from netcut.ops import (
    AddBackstop,
    AddRedirect,
    AddRoute,
    DelAddr,
    DelRoute,
    FilterRule,
    KillFlows,
    Op,
    SetSysctl,
)

Verdict: TypeAlias = Literal["ACCEPT", "REJECT", "REJECT-RST"]
# The kernel's own rules (priority, table): local, main, default. Every lookup goes through
# them; a way out in `main` is already reported as a route, the rule adds nothing.
DEFAULT_RULES = frozenset({(0, 255), (32766, 254), (32767, 253)})
# Verdicts that can only close more: harmless ahead of the jump to NETCUT.
_CLOSING = frozenset({"DROP", "REJECT"})
# linux/rtnetlink.h: RTN_BROADCAST, RTN_ANYCAST, RTN_MULTICAST
_CASTS = frozenset({3, 4, 5})
_ANY_PROTO = frozenset({"", "ip", "ipv6", "all", "0"})
_REJECT_DEFAULT = frozenset({"icmp-port-unreachable", "icmp6-port-unreachable"})


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
            found.append(f"iptables -t nat: chain {NAT_CHAIN} is gone")
    planned = _planned_routes(ops)
    found += [f"route out not in the plan: {r}{_metric(r)}" for r in leaving_routes(ops, state)]
    found += [f"keep route missing: {r}" for r in _missing_routes(planned, state)]
    found += [f"policy rule leads out: {rule}" for rule in _rules_out(ops, state)]
    found += [f"sysctl {k.replace('/', '.')} = {cur} (the cut sets {want})"
              for k, want, cur in _wrong_sysctls(state)]  # fmt: skip
    found += [f"IPv6 address {a}" for a in _ipv6_addrs(state)]
    return tuple(found)


def unverified(state: NamespaceState) -> tuple[str, ...]:
    """What the state dump did not include, so `differences` could not check it."""
    missing = []
    if state.filters is None:
        missing.append("backstop rules and hook (only the chain's presence)")
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
    tool = "ip6tables" if op.family == AF_INET6 else "iptables"
    if op.family not in state.backstop:
        return [f"{tool}: chain {CHAIN} is gone"]
    if state.filters is None:
        return []
    dump = next((d for d in state.filters if d.family == op.family), None)
    if dump is None or dump.chain is None:
        return [f"{tool}: chain {CHAIN} is gone"]
    return [f"{tool}: {line}" for line in (*_hook(dump), *_chain(op.rules, dump))]


def _hook(dump: FilterDump) -> list[str]:
    ahead: list[str] = []
    for rule in dump.output:
        if _is_jump(rule, dump.family):
            return ahead
        if rule.target not in _CLOSING:
            ahead.append(f"OUTPUT rule ahead of the jump to {CHAIN}: {rule}")
    return [*ahead, f"OUTPUT does not jump to {CHAIN}"]


def _is_jump(rule: SeenRule, family: int) -> bool:
    """`-j NETCUT` and nothing else (python-iptables shows "any" as 0.0.0.0/0.0.0.0)."""
    plain = SeenRule(rule.target, proto=rule.proto, src=rule.src, dst=rule.dst)
    anywhere = _cidr(rule.src, family) is None and _cidr(rule.dst, family) is None
    return rule.target == CHAIN and rule == plain and anywhere and (rule.proto or "") in _ANY_PROTO


def _chain(planned: tuple[FilterRule, ...], dump: FilterDump) -> list[str]:
    seen = dump.chain or ()
    found = [as_filter_rule(r, dump.family) for r in seen]
    if tuple(found) == planned:
        return []
    for i, want in enumerate(planned):
        if i >= len(seen):
            return [f"chain {CHAIN} has {len(seen)} of the plan's {len(planned)} rules"]
        if found[i] != want:
            shown = " ".join(want.iptables_args())
            return [f"chain {CHAIN} rule {i + 1} is `{seen[i]}`, the plan has `{shown}`"]
    return [
        f"chain {CHAIN} has rules the plan does not: {'; '.join(map(str, seen[len(planned) :]))}"
    ]


def as_filter_rule(rule: SeenRule, family: int) -> FilterRule | None:
    """The backstop rule `rule` is, or None when it holds anything netcut never writes."""
    verdict = _verdict(rule)
    proto = "" if (rule.proto or "") in _ANY_PROTO else rule.proto
    if verdict is None or proto not in ("", "tcp", "udp") or rule.in_iface:
        return None
    if _cidr(rule.src, family) is not None or (rule.out_iface or "").startswith("!"):
        return None
    dst = _cidr(rule.dst, family)
    if dst == "!":
        return None
    local = ("addrtype", (("dst-type", "LOCAL"),))
    dst_local = local in rule.matches  # transparent mode's narrower loopback (redirect.py)
    if dst_local:
        rule = SeenRule(rule.target, rule.proto, rule.src, rule.dst, rule.in_iface,
                        rule.out_iface, tuple(m for m in rule.matches if m != local),
                        rule.target_params)  # fmt: skip
    dport = _dport(rule, proto)
    if dport == -1:
        return None
    return FilterRule(
        verdict,
        proto="tcp" if proto == "tcp" else "udp" if proto == "udp" else None,
        dst=dst,
        dport=dport,
        out_iface=rule.out_iface or None,
        dst_local=dst_local,
    )


def _verdict(rule: SeenRule) -> Verdict | None:
    params = dict(rule.target_params)
    if rule.target == "ACCEPT" and not params:
        return "ACCEPT"
    if rule.target == "REJECT" and set(params) <= {"reject-with"}:
        with_ = params.get("reject-with", "icmp-port-unreachable")
        if with_ == "tcp-reset":
            return "REJECT-RST"
        if with_ in _REJECT_DEFAULT:
            return "REJECT"
    return None


def _dport(rule: SeenRule, proto: str | None) -> int | None:
    """The one `--dport N` match of `proto`; None without matches; -1 for anything else."""
    if not rule.matches:
        return None
    if len(rule.matches) != 1:
        return -1
    name, params = rule.matches[0]
    value = dict(params).get("dport", "")
    if name != proto or len(params) != 1 or not value.isdigit():
        return -1
    return int(value)


def _cidr(text: str | None, family: int) -> str | None:
    """`addr/mask` or `addr/len` as `addr/len`; None for "any"; "!" for a negation or an
    unreadable value (never equal to a planned rule)."""
    if not text:
        return None
    if text.startswith("!"):
        return "!"
    addr, _, mask = text.partition("/")
    try:
        ip = ipaddress.ip_address(addr)
        length: int
        if not mask:
            length = ip.max_prefixlen
        elif mask.isdigit():
            length = int(mask)
        else:
            length = bin(int(ipaddress.ip_address(mask))).count("1")
    except ValueError:
        return "!"
    if length == 0:
        return None
    return f"{ip}/{length}"


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

"""netcut's status verifier (verify.py): the whole live state against the recorded plan.

Each case tampers with a cut state the way root in the namespace could, and names the
difference the status must list; `repair_ops` applied to the tampered state must leave no
difference (a tiny model of the kernel applies them here; tests/netcut does it for real).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from netcut.iptables_text import CHAIN, SeenRule, as_output_rule, seen_backstop
from netcut.plan.changes import (
    AddBackstop,
    AddRoute,
    DelAddr,
    DelRoute,
    KillFlows,
    Op,
    SetSysctl,
)
from netcut.plan.model import (
    AF_INET,
    AF_INET6,
    NETCUT_PROTO,
    RTN_LOCAL,
    Addr,
    Link,
    Lookup,
    NamespaceState,
    OutputRule,
    PolicyRule,
    Route,
    parse_keep,
)
from netcut.plan.planner import CutPlan, backstop_rules, plan_cut
from netcut.plan.status import judge_status
from netcut.plan.verify import differences, ipv6_sysctls, repair_ops

LO, ETH = Link(1, "lo", True), Link(2, "eth0")
DEFAULT = Route(AF_INET, None, 0, 2, "eth0", gateway="198.19.1.1", proto=3)
CONNECTED = Route(AF_INET, "198.19.1.0", 24, 2, "eth0", proto=2, scope=253, prefsrc="198.19.1.2")
LOCAL = Route(AF_INET, "198.19.1.2", 32, 2, "eth0", table=255, type=RTN_LOCAL, proto=2, scope=254)
V6_LL = Route(AF_INET6, "fe80::", 64, 2, "eth0", proto=2, priority=256, pref=0)
ADDRS = (
    Addr(AF_INET, "127.0.0.1", 8, 1, "lo", scope=254),
    Addr(AF_INET, "198.19.1.2", 24, 2, "eth0"),
    Addr(AF_INET6, "::1", 128, 1, "lo", scope=254),
    Addr(AF_INET6, "fe80::1", 64, 2, "eth0", flags=0x80, scope=253),
)
SYSCTLS = tuple(
    (f"net/ipv6/conf/{n}/{leaf}", v)
    for n in ("all", "default", "lo", "eth0")
    for leaf, v in (("disable_ipv6", "0"), ("accept_ra", "1"))
)
RULES = (
    PolicyRule(AF_INET, 0, 255),
    PolicyRule(AF_INET, 32766, 254),
    PolicyRule(AF_INET, 32767, 253),
    PolicyRule(AF_INET6, 0, 255),
    PolicyRule(AF_INET6, 32766, 254),
)
PROXY = parse_keep("198.19.1.1:3128")
JUMP = SeenRule(CHAIN, proto="ip", src="::/0", dst="::/0")


def seen(rule: OutputRule, family: int) -> SeenRule:
    """`rule` as python-iptables decodes it (netmask form, the default reject-with shown)."""
    mask = "255.255.255.255" if family == AF_INET else "ffff:" * 7 + "ffff"
    dst = f"{rule.dst.split('/')[0]}/{mask}" if rule.dst else None
    params: tuple[tuple[str, str], ...] = ()
    if rule.verdict == "reset":
        params = (("reject-with", "tcp-reset"),)
    elif rule.verdict == "reject":
        icmp = "icmp-port-unreachable" if family == AF_INET else "icmp6-port-unreachable"
        params = (("reject-with", icmp),)
    matches = ((rule.proto or "tcp", (("dport", str(rule.dport)),)),) if rule.dport else ()
    target = "ACCEPT" if rule.verdict == "allow" else "REJECT"
    anywhere = "0.0.0.0/0.0.0.0" if family == AF_INET else "::/0"
    return SeenRule(
        target, rule.proto or "ip", anywhere, dst or anywhere, None, rule.out_iface, matches, params
    )


def before() -> NamespaceState:
    return NamespaceState(
        links=(LO, ETH),
        addrs=ADDRS,
        routes=(DEFAULT, CONNECTED, LOCAL, V6_LL),
        sysctls=SYSCTLS,
        lookups=(Lookup("198.19.1.1", 1, 2, "eth0", None, "198.19.1.2"),),
    )


def apply_model(state: NamespaceState, ops: tuple[Op, ...]) -> NamespaceState:
    """What the kernel holds after `ops` (enough of it for these tests)."""
    routes, addrs = list(state.routes), list(state.addrs)
    sysctls, filters = dict(state.sysctls), {d.family: d for d in state.filters or ()}
    for op in ops:
        if isinstance(op, AddBackstop):
            chain = tuple(seen(r, op.family) for r in op.rules)
            filters[op.family] = seen_backstop(op.family, (JUMP,), chain)
        elif isinstance(op, AddRoute):
            routes.append(op.route)
        elif isinstance(op, DelRoute):
            routes = [r for r in routes if r.key != op.route.key]
        elif isinstance(op, DelAddr):
            addrs = [a for a in addrs if a.address != op.addr.address]
        elif isinstance(op, SetSysctl):
            sysctls[op.key] = op.value
        else:
            assert isinstance(op, KillFlows)
    return replace(
        state,
        routes=tuple(routes),
        addrs=tuple(addrs),
        sysctls=tuple(sysctls.items()),
        backstop=tuple(sorted(filters)),
        filters=tuple(filters[f] for f in sorted(filters)),
        policy_rules=state.policy_rules if state.policy_rules is not None else RULES,
    )


PLAN: CutPlan = plan_cut(before(), (PROXY,))
CUT = apply_model(before(), PLAN.ops)
GW_METRIC_50 = Route(AF_INET, None, 0, 2, "eth0", gateway="198.19.1.1", proto=4, priority=50)
TABLE_100 = replace(GW_METRIC_50, table=100, priority=None)


def with_filter(
    family: int,
    *,
    output: tuple[SeenRule, ...] | None = None,
    chain: tuple[SeenRule, ...] | str | None = "same",
) -> NamespaceState:
    """CUT with `family`'s iptables OUTPUT chain and chain NETCUT as given, read back by the
    iptables backend's decoding (iptables_text.seen_backstop)."""
    planned = next(op for op in PLAN.ops if isinstance(op, AddBackstop) and op.family == family)
    raw = tuple(seen(r, family) for r in planned.rules) if chain == "same" else chain
    assert not isinstance(raw, str)
    dump = seen_backstop(family, (JUMP,) if output is None else output, raw)
    return replace(CUT, filters=tuple(dump if d.family == family else d for d in CUT.filters or ()))


def v4_rules() -> tuple[SeenRule, ...]:
    return tuple(seen(r, AF_INET) for r in backstop_rules(AF_INET, (PROXY,)))


ACCEPT_ALL = SeenRule("ACCEPT", proto="ip")
TAMPERS: dict[str, tuple[NamespaceState, str]] = {
    "flushed-chain+default-metric-50": (
        replace(with_filter(AF_INET, chain=()), routes=(*CUT.routes, GW_METRIC_50)),
        "route out not in the plan: default via 198.19.1.1 dev eth0 proto static metric 50",
    ),
    "accept-ahead-of-jump": (
        with_filter(AF_INET, output=(ACCEPT_ALL, JUMP)),
        "IPv4 backstop: output rule ahead of it: -p ip -j ACCEPT",
    ),
    "no-jump": (
        with_filter(AF_INET6, output=()),
        "IPv6 backstop: output does not pass through it first",
    ),
    "chain-gone": (replace(CUT, backstop=(AF_INET,)), "IPv6 backstop is gone"),
    "extra-accept-in-chain": (
        with_filter(AF_INET, chain=(ACCEPT_ALL, *v4_rules())),
        "IPv4 backstop: rule 1 is `-p ip -j ACCEPT`",
    ),
    "appended-owner-accept": (
        with_filter(
            AF_INET,
            chain=(
                *v4_rules(),
                SeenRule("ACCEPT", "ip", matches=(("owner", (("uid-owner", "0"),)),)),
            ),
        ),
        "IPv4 backstop: it has rules the plan does not: -p ip -m owner --uid-owner 0",
    ),
    "route-in-table-100+rule": (
        replace(
            CUT,
            routes=(*CUT.routes, TABLE_100),
            policy_rules=(*RULES, PolicyRule(AF_INET, 100, 100)),
        ),
        "policy rule leads out: 100: from all lookup 100",
    ),
    "sysctl-flipped": (
        replace(
            CUT,
            sysctls=tuple(
                (k, "0" if k.endswith("eth0/disable_ipv6") else v) for k, v in CUT.sysctls
            ),
        ),
        "sysctl net.ipv6.conf.eth0.disable_ipv6 = 0 (the cut sets 1)",
    ),
    "accept-ra-on": (
        replace(
            CUT,
            sysctls=tuple((k, "1" if k.endswith("all/accept_ra") else v) for k, v in CUT.sysctls),
        ),
        "sysctl net.ipv6.conf.all.accept_ra = 1 (the cut sets 0)",
    ),
    "ipv6-address-back": (
        replace(CUT, addrs=(*CUT.addrs, ADDRS[3])),
        "IPv6 address fe80::1/64 dev eth0",
    ),
    "keep-route-gone": (
        replace(CUT, routes=tuple(r for r in CUT.routes if r.proto != NETCUT_PROTO)),
        "keep route missing: 198.19.1.1/32 dev eth0 proto netcut scope link",
    ),
    "multipath-route": (
        replace(CUT, routes=(*CUT.routes, Route(AF_INET, "198.18.0.0", 15, None, None))),
        "route out not in the plan: 198.18.0.0/15 proto static",
    ),
    "broadcast-route-in-main": (
        replace(
            CUT,
            routes=(
                *CUT.routes,
                Route(AF_INET, "198.19.1.255", 32, 2, "eth0", type=3, proto=4, scope=253),
            ),
        ),
        "route out not in the plan: 198.19.1.255/32 dev eth0 proto static scope link",
    ),
    "connected-route-back": (
        replace(CUT, routes=(*CUT.routes, CONNECTED)),
        "route out not in the plan: 198.19.1.0/24 dev eth0 proto kernel scope link",
    ),
}


def test_the_cut_itself_has_no_difference() -> None:
    assert differences(PLAN.ops, CUT) == ()
    status = judge_status(PLAN, CUT)
    assert status.state == "cut"
    assert status.lines()[:2] == ["cut", "keep: 198.19.1.1:3128"]


@pytest.mark.parametrize(("name"), list(TAMPERS), ids=list(TAMPERS))
def test_tamper_is_partial_and_named(name: str) -> None:
    tampered, expected = TAMPERS[name]
    status = judge_status(PLAN, tampered)
    assert status.state == "partial"
    assert status.lines()[0] == "partial"
    assert any(d.startswith(expected) for d in status.details), status.details


@pytest.mark.parametrize(("name"), list(TAMPERS), ids=list(TAMPERS))
def test_repair_ops_leave_no_difference(name: str) -> None:
    tampered, _ = TAMPERS[name]
    ops = repair_ops(PLAN.ops, tampered)
    assert ops, "a partial cut needs a repair"
    assert isinstance(ops[-1], KillFlows), "flows opened during the tamper are destroyed"
    if any(isinstance(op, AddBackstop) for op in ops):
        assert isinstance(ops[0], AddBackstop), "the backstop first: closed from step one"
    assert differences(PLAN.ops, apply_model(tampered, ops)) == ()


@pytest.mark.parametrize(
    "output",
    [
        (SeenRule("DROP", "ip", dst="198.18.0.1/255.255.255.255"), JUMP),
        (SeenRule("REJECT", "ip"), JUMP),
        (JUMP, ACCEPT_ALL),
    ],
    ids=["drop-ahead", "reject-ahead", "accept-after-jump"],
)
def test_harmless_output_rules_are_not_differences(output: tuple[SeenRule, ...]) -> None:
    assert differences(PLAN.ops, with_filter(AF_INET, output=output)) == ()


def test_the_kernels_own_broadcast_and_local_routes_are_not_differences() -> None:
    own = (
        Route(AF_INET, "198.19.1.255", 32, 2, "eth0", table=255, type=3, proto=2, scope=253),
        LOCAL,
        Route(AF_INET, "127.0.0.0", 8, 1, "lo", table=255, type=RTN_LOCAL, proto=2),
    )
    assert differences(PLAN.ops, replace(CUT, routes=(*CUT.routes, *own))) == ()


def test_rule_to_an_empty_table_is_not_a_difference() -> None:
    ruled = replace(CUT, policy_rules=(*RULES, PolicyRule(AF_INET, 100, 100)))
    assert differences(PLAN.ops, ruled) == ()


def test_a_jump_with_a_match_is_not_the_hook() -> None:
    odd = SeenRule(CHAIN, "ip", dst="198.18.0.1/255.255.255.255")
    found = differences(PLAN.ops, with_filter(AF_INET, output=(odd,)))
    assert "IPv4 backstop: output does not pass through it first" in found


def test_a_dump_without_rules_is_reported_as_not_verified() -> None:
    bare = replace(CUT, filters=None, policy_rules=None)
    status = judge_status(PLAN, bare)
    assert status.state == "cut"
    assert "not verified: policy rules" in status.details


@pytest.mark.parametrize("family", [AF_INET, AF_INET6], ids=["v4", "v6"])
def test_every_backstop_rule_reads_back_as_itself(family: int) -> None:
    keeps = (PROXY, parse_keep("198.19.1.9"), parse_keep("127.0.0.1:9"))
    for rule in backstop_rules(family, keeps, ("127.0.0.11",)):
        assert as_output_rule(seen(rule, family), family) == rule


@pytest.mark.parametrize(
    "rule",
    [
        SeenRule("ACCEPT", "ip", dst="!198.18.0.1/32"),
        SeenRule("ACCEPT", "ip", in_iface="eth0"),
        SeenRule("ACCEPT", "ip", src="198.18.0.1/32"),
        SeenRule("ACCEPT", "icmp"),
        SeenRule("REJECT", "ip", target_params=(("reject-with", "icmp-host-prohibited"),)),
        SeenRule("ACCEPT", "tcp", matches=(("tcp", (("dport", "1:65535"),)),)),
        SeenRule("ACCEPT", "tcp", matches=(("udp", (("dport", "53"),)),)),
        SeenRule("ACCEPT", "ip", out_iface="!lo"),
        SeenRule("LOG", "ip"),
        SeenRule("ACCEPT", "ip", dst="bogus/32"),
    ],
    ids=[
        "negated-dst",
        "in-iface",
        "src",
        "icmp",
        "other-reject",
        "port-range",
        "match-mismatch",
        "negated-oif",
        "log",
        "bad-dst",
    ],
)
def test_rules_netcut_never_writes_are_not_read_as_its_own(rule: SeenRule) -> None:
    assert as_output_rule(rule, AF_INET) is None


_text = st.one_of(st.none(), st.text(max_size=20))


@given(
    st.text(max_size=10),
    _text,
    _text,
    _text,
    _text,
    _text,
    st.lists(
        st.tuples(
            st.text(max_size=6),
            st.lists(st.tuples(st.text(max_size=6), st.text(max_size=8)), max_size=2).map(tuple),
        ),
        max_size=2,
    ).map(tuple),
)
def test_as_output_rule_reads_or_refuses_never_raises(
    target: str,
    proto: str | None,
    src: str | None,
    dst: str | None,
    iif: str | None,
    oif: str | None,
    matches: tuple[tuple[str, tuple[tuple[str, str], ...]], ...],
) -> None:
    rule = SeenRule(target, proto, src, dst, iif, oif, matches)
    found = as_output_rule(rule, AF_INET)
    assert found is None or isinstance(found, OutputRule)


# unicast, local, broadcast, multicast, blackhole, unreachable
_TYPES = (1, 2, 3, 5, 6, 7)


@st.composite
def extra_routes(draw: st.DrawFn) -> tuple[Route, ...]:
    routes = []
    for i in range(draw(st.integers(0, 4))):
        table = draw(st.sampled_from([100, 254, 255, 253, 1000]))
        rtype = draw(st.sampled_from(_TYPES))
        oif, ifname = draw(st.sampled_from([(1, "lo"), (2, "eth0"), (None, None)]))
        gateway = draw(st.sampled_from([None, "198.19.1.1", "198.19.1.7"]))
        routes.append(Route(AF_INET, f"198.18.{i}.0", draw(st.integers(0, 32)), oif, ifname,
                            table=table, type=rtype, gateway=gateway, proto=4,
                            priority=draw(st.sampled_from([None, 50]))))  # fmt: skip
    return tuple(routes)


@given(
    extra_routes(),
    st.lists(st.sampled_from([k for k, _ in SYSCTLS]), max_size=3, unique=True),
    st.lists(st.integers(1, 300), max_size=2, unique=True),
)
def test_any_tamper_is_seen_exactly_when_it_opens_something_and_repair_clears_it(
    routes: tuple[Route, ...], flipped: list[str], rule_tables: list[int]
) -> None:
    """Generated tampers: routes of every type, table and interface; sysctls flipped;
    policy rules to any table. A difference is reported if and only if the tamper added a
    route that sends out of eth0 (or of no single interface) or flipped a sysctl the cut
    sets; and the repair ops leave none."""
    want = dict(CUT.sysctls)
    sysctls = tuple((k, ("1" if v == "0" else "0") if k in flipped else v) for k, v in want.items())
    rules = (*RULES, *(PolicyRule(AF_INET, 100 + i, t) for i, t in enumerate(rule_tables)))
    tampered = replace(CUT, routes=(*CUT.routes, *routes), sysctls=sysctls, policy_rules=rules)
    sends = [r for r in routes if r.oif != 1 and (r.type == 1 or (r.type in (3, 5)
                                                                 and r.table != 255))]  # fmt: skip
    flips = [k for k in flipped if k in dict(ipv6_sysctls(CUT))]  # what the cut sets
    found = differences(PLAN.ops, tampered)
    assert bool(found) == bool(sends or flips), found
    assert differences(PLAN.ops, apply_model(tampered, repair_ops(PLAN.ops, tampered))) == ()

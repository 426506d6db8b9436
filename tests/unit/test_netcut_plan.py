"""netcut's pure core: keep parsing, the cut plan, its inverse, status judgement, records."""

from __future__ import annotations

import ipaddress
import json
import socket
from dataclasses import replace

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from netcut.errors import InvalidInput
from netcut.iptables_text import filter_args
from netcut.plan.changes import (
    AddAddr,
    AddBackstop,
    AddRoute,
    DelAddr,
    DelRoute,
    KillFlows,
    RemoveBackstop,
    SetSysctl,
)
from netcut.plan.model import (
    AF_INET,
    AF_INET6,
    NETCUT_PROTO,
    RTN_LOCAL,
    Addr,
    Keep,
    Link,
    Lookup,
    NamespaceState,
    OutputRule,
    Route,
    parse_keep,
)
from netcut.plan.planner import (
    CutPlan,
    backstop_rules,
    invert,
    plan_cut,
    plan_restore,
)
from netcut.plan.status import judge_status
from netcut.records import plan_from_data, plan_to_data

LO, ETH = Link(1, "lo", True), Link(2, "eth0")
DEFAULT = Route(AF_INET, None, 0, 2, "eth0", gateway="198.19.1.1", proto=3)
CONNECTED = Route(AF_INET, "198.19.1.0", 24, 2, "eth0", proto=2, scope=253, prefsrc="198.19.1.2")
LOCAL = Route(AF_INET, "198.19.1.2", 32, 2, "eth0", table=255, type=RTN_LOCAL, proto=2, scope=254)
V6_LL = Route(AF_INET6, "fe80::", 64, 2, "eth0", proto=2, priority=256, pref=0)
V6_LO = Route(AF_INET6, "::1", 128, 1, "lo", proto=2, priority=256, pref=0)
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


def state(**over: object) -> NamespaceState:
    base: dict[str, object] = dict(
        links=(LO, ETH),
        addrs=ADDRS,
        routes=(DEFAULT, CONNECTED, LOCAL, V6_LL, V6_LO),
        sysctls=SYSCTLS,
        lookups=(Lookup("198.19.1.1", 1, 2, "eth0", None, "198.19.1.2"),),
    )
    base.update(over)
    return NamespaceState(**base)  # type: ignore[arg-type]


PROXY = parse_keep("198.19.1.1:3128")


@pytest.mark.parametrize(
    ("text", "addr", "port"),
    [
        ("198.19.1.1", "198.19.1.1", None),
        ("198.19.1.1:3128", "198.19.1.1", 3128),
        (" 127.0.0.1:80 ", "127.0.0.1", 80),
        ("::1", "::1", None),
        ("[::1]:8080", "::1", 8080),
        ("[fe80::1]", "fe80::1", None),
    ],
    ids=["v4", "v4-port", "spaces", "v6", "v6-port", "v6-brackets"],
)
def test_parse_keep(text: str, addr: str, port: int | None) -> None:
    keep = parse_keep(text)
    assert keep == Keep(ipaddress.ip_address(addr), port)
    assert parse_keep(str(keep)) == keep


@pytest.mark.parametrize(
    "text",
    [
        "example.com",
        "example.com:80",
        "1.2.3.4:0",
        "1.2.3.4:65536",
        "1.2.3.4:x",
        "[::1",
        "[::1]x",
        "",
        "1.2.3.4:",
        "999.1.1.1",
    ],
    ids=[
        "name",
        "name-port",
        "port0",
        "port-big",
        "port-text",
        "open-bracket",
        "junk-after",
        "empty",
        "empty-port",
        "bad-octet",
    ],
)
def test_parse_keep_rejects(text: str) -> None:
    with pytest.raises(InvalidInput, match="keep"):
        parse_keep(text)


@given(st.ip_addresses(), st.one_of(st.none(), st.integers(1, 65535)))
def test_keep_roundtrips(
    addr: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int | None
) -> None:
    keep = Keep(addr, port)
    assert parse_keep(str(keep)) == keep


def test_plan_order_backstop_first_then_keep_then_deletes() -> None:
    plan = plan_cut(state(), (PROXY,))
    kinds = [type(op).__name__ for op in plan.ops]
    assert kinds[:3] == ["AddBackstop", "AddBackstop", "AddRoute"]
    assert kinds[-1] == "KillFlows"
    deletes = [op.route for op in plan.ops if isinstance(op, DelRoute)]
    assert deletes == [DEFAULT, CONNECTED, V6_LL], "gateway routes before connected ones"
    assert LOCAL not in deletes
    assert V6_LO not in deletes


def test_keep_route_is_a_marked_host_route_on_the_interface_that_reached_it() -> None:
    (add,) = [op for op in plan_cut(state(), (PROXY,)).ops if isinstance(op, AddRoute)]
    r = add.route
    assert (r.dst, r.dst_len, r.ifname, r.proto, r.gateway) == (
        "198.19.1.1",
        32,
        "eth0",
        NETCUT_PROTO,
        None,
    )
    assert r.prefsrc == "198.19.1.2"


def test_keep_behind_a_gateway_gets_an_onlink_route_via_it() -> None:
    s = state(lookups=(Lookup("198.19.9.9", 1, 2, "eth0", "198.19.1.1", "198.19.1.2"),))
    (add,) = [
        op for op in plan_cut(s, (parse_keep("198.19.9.9:443"),)).ops if isinstance(op, AddRoute)
    ]
    assert add.route.gateway == "198.19.1.1"
    assert "onlink" in add.route.ip_args()


@pytest.mark.parametrize(
    "keep",
    ["127.0.0.1:8080", "::1", "198.19.1.2:22"],
    ids=["loopback-v4", "loopback-v6", "own-address"],
)
def test_local_keeps_need_no_route(keep: str) -> None:
    s = state(lookups=(Lookup("198.19.1.2", RTN_LOCAL, 1, "lo"),))
    assert not [op for op in plan_cut(s, (parse_keep(keep),)).ops if isinstance(op, AddRoute)]


@pytest.mark.parametrize(
    ("keep", "message"),
    [
        ("2001:db8::1", "disables IPv6"),
        ("198.19.1.1:53", "port 53"),
        ("198.19.7.7", "no route"),
        ("0.0.0.0", "unicast"),
    ],
    ids=["ipv6", "dns-port", "unroutable", "unspecified"],
)
def test_plan_rejects_keeps_it_cannot_honour(keep: str, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        plan_cut(state(lookups=(Lookup("198.19.7.7", None),)), (parse_keep(keep),))


def test_cut_with_no_keep() -> None:
    plan = plan_cut(state(), ())
    assert not [op for op in plan.ops if isinstance(op, AddRoute)]
    assert plan.lines()[0] == "keep: nothing but loopback"


def test_ipv6_off_everywhere_but_loopback() -> None:
    ops = [op for op in plan_cut(state(), ()).ops if isinstance(op, SetSysctl)]
    keys = {op.key: op.value for op in ops}
    assert keys["net/ipv6/conf/eth0/disable_ipv6"] == "1"
    assert keys["net/ipv6/conf/default/disable_ipv6"] == "1"
    assert "net/ipv6/conf/lo/disable_ipv6" not in keys, "::1 stays"
    assert "net/ipv6/conf/all/disable_ipv6" not in keys, "all/ would take lo's ::1 too"
    assert keys["net/ipv6/conf/all/accept_ra"] == "0"
    dels = [op.addr.address for op in plan_cut(state(), ()).ops if isinstance(op, DelAddr)]
    assert dels == ["fe80::1"]


def test_sysctls_already_in_place_are_not_touched() -> None:
    done = tuple((k, "1" if k.endswith("disable_ipv6") else "0") for k, _ in SYSCTLS)
    assert not [op for op in plan_cut(state(sysctls=done), ()).ops if isinstance(op, SetSysctl)]


def test_backstop_rules_dns_first_then_loopback_then_keeps_then_reject() -> None:
    rules = backstop_rules(AF_INET, (PROXY, parse_keep("198.19.5.5")), ("127.0.0.11", "127.0.0.1"))
    args = [" ".join(filter_args(r)) for r in rules]
    assert args == [
        "-p udp -m udp --dport 53 -j REJECT",
        "-p tcp -m tcp --dport 53 -j REJECT --reject-with tcp-reset",
        "-d 127.0.0.11/32 -j REJECT",
        "-o lo -j ACCEPT",
        "-d 198.19.1.1/32 -p tcp -m tcp --dport 3128 -j ACCEPT",
        "-d 198.19.5.5/32 -j ACCEPT",
        "-p tcp -j REJECT --reject-with tcp-reset",
        "-j REJECT",
    ]


def test_kill_flows_spares_kept_and_local_peers() -> None:
    (kill,) = [op for op in plan_cut(state(), (PROXY,)).ops if isinstance(op, KillFlows)]
    assert ("198.19.1.1", 3128) in kill.allowed
    assert ("198.19.1.2", None) in kill.allowed


@pytest.mark.parametrize(
    ("op", "inverse"),
    [
        (AddRoute(DEFAULT), DelRoute(DEFAULT)),
        (DelRoute(CONNECTED), AddRoute(CONNECTED)),
        (SetSysctl("k", "1", "0"), SetSysctl("k", "0", "1")),
        (AddBackstop(AF_INET, ()), RemoveBackstop(AF_INET)),
        (DelAddr(ADDRS[3]), AddAddr(Addr(AF_INET6, "fe80::1", 64, 2, "eth0", 0x80, 253))),
        (KillFlows(()), None),
    ],
    ids=["add-route", "del-route", "sysctl", "backstop", "addr-as-it-was", "flows"],
)
def test_invert(op: object, inverse: object) -> None:
    assert invert(op) == inverse  # type: ignore[arg-type]


def test_restore_is_the_reverse_of_the_cut_plus_stray_marks() -> None:
    plan = plan_cut(state(), (PROXY,))
    stray = Route(AF_INET, "198.19.8.8", 32, 2, "eth0", proto=NETCUT_PROTO)
    undo = plan_restore(plan, state(routes=(stray,), backstop=(AF_INET,)))
    assert undo.complete
    assert undo.ops.count(RemoveBackstop(AF_INET)) == 1
    assert undo.ops[0] == SetSysctl("net/ipv6/conf/eth0/disable_ipv6", "0", "1")
    re_added = [op.route for op in undo.ops if isinstance(op, AddRoute)]
    assert re_added == [V6_LL, CONNECTED, DEFAULT], "connected routes before gateways"
    assert DelRoute(stray) in undo.ops


def test_restore_of_a_journal_undoes_what_ran_and_the_op_in_flight() -> None:
    plan = plan_cut(state(), (PROXY,))
    killed = replace(plan, applied=2)  # ops 0 and 1 noted; op 2 may have run unnoted
    undo = plan_restore(killed, state(backstop=(AF_INET,)))
    expected = [inv for op in reversed(plan.ops[:3]) if (inv := invert(op)) is not None]
    assert list(undo.ops[: len(expected)]) == expected
    assert not any(isinstance(op, SetSysctl) for op in undo.ops), "sysctls never ran"
    assert undo.complete


def test_restore_without_record_removes_marks_only() -> None:
    marked = Route(AF_INET, "198.19.1.1", 32, 2, "eth0", proto=NETCUT_PROTO)
    undo = plan_restore(None, state(routes=(marked, CONNECTED), backstop=(AF_INET, AF_INET6)))
    assert not undo.complete
    assert undo.ops == (DelRoute(marked), RemoveBackstop(AF_INET), RemoveBackstop(AF_INET6))


def _after(plan: CutPlan, before: NamespaceState) -> NamespaceState:
    """The state a faithful executor leaves behind (for judging status)."""
    removed = {op.route.key for op in plan.ops if isinstance(op, DelRoute)}
    added = tuple(op.route for op in plan.ops if isinstance(op, AddRoute))
    sysctls = dict(before.sysctls)
    sysctls.update({op.key: op.value for op in plan.ops if isinstance(op, SetSysctl)})
    return NamespaceState(
        before.links,
        tuple(a for a in before.addrs if a.family == AF_INET or a.index == 1),
        tuple(r for r in before.routes if r.key not in removed) + added,
        tuple(sysctls.items()),
        backstop=(AF_INET, AF_INET6),
    )


def test_status_cut_partial_not_cut() -> None:
    before = state()
    plan = plan_cut(before, (PROXY,))
    after = _after(plan, before)
    assert judge_status(plan, after).state == "cut"
    assert judge_status(plan, after).lines()[:2] == ["cut", "keep: 198.19.1.1:3128"]
    assert judge_status(None, before).state == "not cut"
    half = NamespaceState(after.links, after.addrs, after.routes, after.sysctls, backstop=())
    partial = judge_status(plan, half)
    assert partial.state == "partial"
    assert partial.lines()[0] == "partial"
    assert judge_status(None, after).state == "partial", "marks without a record"


def test_record_roundtrip() -> None:
    plan = plan_cut(state(), (PROXY, parse_keep("127.0.0.1:9")))
    data = json.loads(json.dumps(plan_to_data(plan)))
    assert plan_from_data(data) == plan


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"version": 99, "ops": [], "keeps": []},
        {"version": 1, "ops": [{"op": "Nope"}], "keeps": []},
    ],
    ids=["empty", "version", "unknown-op"],
)
def test_bad_record_is_invalid_input(data: dict[str, object]) -> None:
    with pytest.raises(InvalidInput):
        plan_from_data(data)


def test_family_constants_match_the_socket_module() -> None:
    assert (AF_INET, AF_INET6) == (socket.AF_INET, socket.AF_INET6)


def test_output_rule_reset() -> None:
    assert filter_args(OutputRule("reset", proto="tcp")) == [
        "-p",
        "tcp",
        "-j",
        "REJECT",
        "--reject-with",
        "tcp-reset",
    ]


def test_no_ipv6_in_the_kernel_means_no_ip6tables_backstop() -> None:
    v4_only = state(sysctls=(), routes=(DEFAULT, CONNECTED, LOCAL), addrs=ADDRS[:2])
    families = [op.family for op in plan_cut(v4_only, (PROXY,)).ops if isinstance(op, AddBackstop)]
    assert families == [AF_INET]


def test_a_record_without_marks_is_stale() -> None:
    plan = plan_cut(state(), (PROXY,))
    status = judge_status(plan, state())
    assert status.state == "not cut"
    assert status.details == ("stale record ignored",)


@given(st.text(max_size=60))
@example(":¹")  # isdigit() but not int(): was a ValueError
@example("198.18.0.1:٨٠")  # int() reads 80: was accepted as port 80
def test_parse_keep_parses_or_raises_invalid_input(text: str) -> None:
    try:
        keep = parse_keep(text)
    except InvalidInput:
        return
    assert parse_keep(str(keep)) == keep


@pytest.mark.parametrize("text", [":¹", "198.18.0.1:¹", "198.18.0.1:٨٠", "[::1]:８０"])
def test_a_port_is_ascii_digits_only(text: str) -> None:
    with pytest.raises(InvalidInput, match="port must be 1-65535"):
        parse_keep(text)

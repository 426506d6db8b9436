"""No lookup decides nothing (issue 32): the contract of `judge` (egress/policy/judge.py) on a
name before resolution.

A refusal without `needs_addrs` is final: no set of addresses could make it an allow, so the
proxy refuses without a DNS query. A refusal with `needs_addrs` is one some address could
still turn into an allow. Allow address rules admit address destinations; a name reaches them
only with the opt-in `resolve_names_for_address_rules` (docs/policy.md#no-lookup-decides-nothing).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from egress.config import build_settings
from egress.policy.addrs import ALWAYS_RESERVED, PRIVATE_NETWORKS, AddressGuard
from egress.policy.judge import judge, judge_name
from egress.policy.rules import Policy
from egress.policy.target import IPAddress, IPNetwork, Scheme, Target, make_target

EVIL = "c2vjcmv0.evil.test"
OPT = {"resolve_names_for_address_rules": True}


NO_EXTRA = AddressGuard()
LOOPBACK_8089 = ipaddress.ip_address("127.0.0.1")


@dataclass(frozen=True)
class Case:
    allow: tuple[str, ...]
    block: tuple[str, ...] = ()
    opt_in: bool = False
    guard: AddressGuard = NO_EXTRA
    scheme: Scheme = "https"
    port: int = 443
    host: str = EVIL
    lookup: bool = False  # the refusal waits for addresses (the name would be resolved)
    allowed: bool = False


CASES = {
    # the shapes: a name no rule can allow is refused without a lookup
    "addr:22, CONNECT 443": Case(("github.test", "203.0.113.7:22")),
    "addr:22, http": Case(("github.test", "203.0.113.7:22"), scheme="http", port=80),
    "addr:22, CONNECT 22": Case(("github.test", "203.0.113.7:22"), port=22),
    "https://addr, http": Case(("https://203.0.113.7",), scheme="http", port=80),
    "https://addr, CONNECT": Case(("https://203.0.113.7",)),
    "guarded 127.0.0.1:8089": Case(("127.0.0.1:8089",), port=8089),
    "10/8 reserve-private": Case(("10.0.0.0/8",), guard=AddressGuard(reserve_private=True)),
    "allow /24 block /24": Case(("203.0.113.0/24",), ("203.0.113.0/24",)),
    "allow :* block :*": Case(("203.0.113.0/24:*",), ("203.0.113.0/24",), port=22),
    "cidr, name resolving into it": Case(("198.18.0.0/15",)),
    # the same shapes with the opt-in: only where an address rule could still allow
    "opt-in addr:22, CONNECT 443": Case(("github.test", "203.0.113.7:22"), opt_in=True),
    "opt-in addr:22, http": Case(
        ("github.test", "203.0.113.7:22"), opt_in=True, scheme="http", port=80
    ),
    "opt-in addr:22, CONNECT 22": Case(
        ("github.test", "203.0.113.7:22"), opt_in=True, port=22, lookup=True
    ),
    "opt-in https://addr, http": Case(
        ("https://203.0.113.7",), opt_in=True, scheme="http", port=80
    ),
    "opt-in https://addr, CONNECT": Case(("https://203.0.113.7",), opt_in=True, lookup=True),
    "opt-in guarded 127.0.0.1:8089": Case(("127.0.0.1:8089",), opt_in=True, port=8089),
    "opt-in guarded, exempt endpoint": Case(
        ("127.0.0.1:8089",),
        opt_in=True,
        port=8089,
        guard=AddressGuard(exempt=frozenset({(LOOPBACK_8089, 8089)})),
        lookup=True,
    ),
    "opt-in exempt on another port": Case(
        ("127.0.0.0/8:*",),
        opt_in=True,
        port=8089,
        guard=AddressGuard(exempt=frozenset({(LOOPBACK_8089, 9000)})),
    ),
    "opt-in 10/8 reserve-private": Case(
        ("10.0.0.0/8",), opt_in=True, guard=AddressGuard(reserve_private=True)
    ),
    "opt-in 10/8, not reserved": Case(("10.0.0.0/8",), opt_in=True, lookup=True),
    "opt-in 10/8 --reserve 10/8": Case(
        ("10.0.0.0/8",),
        opt_in=True,
        guard=AddressGuard(extra=(ipaddress.ip_network("10.0.0.0/8"),)),
    ),
    "opt-in allow /24 block /24": Case(("203.0.113.0/24",), ("203.0.113.0/24",), opt_in=True),
    "opt-in allow /24 block two /25": Case(
        ("203.0.113.0/24",), ("203.0.113.0/25", "203.0.113.128/25"), opt_in=True
    ),
    "opt-in allow /24 block one /25": Case(
        ("203.0.113.0/24",), ("203.0.113.0/25",), opt_in=True, lookup=True
    ),
    "opt-in block half, reserve the other": Case(
        ("10.0.0.0/8",),
        ("10.0.0.0/9",),
        opt_in=True,
        guard=AddressGuard(extra=(ipaddress.ip_network("10.128.0.0/9"),)),
    ),
    "opt-in block on that port only": Case(("203.0.113.7",), ("https://203.0.113.7",), opt_in=True),
    "opt-in block on another port": Case(
        ("203.0.113.7",),
        ("https://203.0.113.7",),
        opt_in=True,
        scheme="http",
        port=80,
        lookup=True,
    ),
    "opt-in :* closed on 443 by a port block": Case(
        ("203.0.113.7:*",), ("https://203.0.113.7",), opt_in=True
    ),
    "opt-in :* open on 22": Case(
        ("203.0.113.7:*",), ("https://203.0.113.7",), opt_in=True, port=22, lookup=True
    ),
    "opt-in host block is final": Case(("203.0.113.0/24",), (EVIL,), opt_in=True),
    # allowed names still resolve (they are allowed: the guard needs their addresses)
    "allowed name": Case(("github.test", "203.0.113.7:22"), host="github.test", allowed=True),
    "allowed name, block cidr": Case(
        ("github.test",), ("203.0.113.0/24",), host="github.test", allowed=True
    ),
}


def verdict(case: Case, addrs: tuple[IPAddress, ...] = ()) -> tuple[Policy, Target, object]:
    policy = Policy(allow=case.allow, block=case.block, resolve_names_for_address_rules=case.opt_in)
    target = make_target(case.scheme, case.host, case.port)
    return policy, target, judge(policy, case.guard, target, addrs)


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_refusal_asks_for_addresses_only_when_one_could_allow(case: Case) -> None:
    _, _, decision = verdict(case)
    assert decision.allowed is case.allowed  # type: ignore[attr-defined]
    if not case.allowed:
        assert decision.needs_addrs is case.lookup  # type: ignore[attr-defined]


def test_addresses_allow_names_only_with_the_opt_in() -> None:
    inside = (ipaddress.ip_address("198.18.0.5"),)
    guard = AddressGuard()
    off = Policy(allow=["198.18.0.0/15"])
    on = Policy(allow=["198.18.0.0/15"], **OPT)  # type: ignore[arg-type]
    name = make_target("https", "a.test", 443)
    assert not judge(off, guard, name, inside).allowed
    assert judge(on, guard, name, inside).allowed
    for policy in (off, on):  # the address itself, in every spelling, is a destination
        assert judge(policy, guard, make_target("https", "198.18.0.5", 443)).allowed
        assert judge(policy, guard, make_target("https", "3323068421", 443)).allowed


def test_the_opt_in_is_a_file_key_a_client_key_and_part_of_the_hash() -> None:
    plain = build_settings({"allow": ["198.18.0.0/15"]})
    opted = build_settings(
        {
            "allow": ["198.18.0.0/15"],
            "resolve_names_for_address_rules": True,
            "clients": {
                "a": {"token": "t1", "allow": ["198.18.0.0/15"]},
                "b": {"token": "t2", "resolve_names_for_address_rules": False},
            },
        }
    )
    assert not plain.policy.resolve_names_for_address_rules
    assert opted.policy.resolve_names_for_address_rules
    by_id = {c.client_id: c.policy for c in opted.clients}
    assert by_id["a"].resolve_names_for_address_rules  # inherited, like `mode`
    assert not by_id["b"].resolve_names_for_address_rules
    assert plain.policy.digest == Policy(allow=["198.18.0.0/15"]).digest  # unchanged hashes
    assert plain.policy.digest != opted.policy.digest
    assert opted.policy.canonical()["resolve_names_for_address_rules"] is True
    assert "resolve_names_for_address_rules" not in plain.policy.canonical()


@pytest.mark.parametrize("value", ["true", 1, "yes"])
def test_the_opt_in_is_a_real_boolean(value: object) -> None:
    from egress.errors import PolicyError

    with pytest.raises(PolicyError, match="resolve_names_for_address_rules"):
        build_settings({"resolve_names_for_address_rules": value})
    with pytest.raises(TypeError, match="resolve_names_for_address_rules"):
        Policy(resolve_names_for_address_rules=value)  # type: ignore[arg-type]


# -------------------------------------------------------------------------------------------
# The contract, as a property: over policies built from overlapping networks (allow, block,
# reserved, exempt), every refusal of a name is either final for every address or has an
# address that turns it into an allow.

NETS4 = [
    "203.0.113.0/24", "203.0.113.0/25", "203.0.113.128/25", "203.0.113.7/32", "203.0.113.8/29",
    "10.0.0.0/8", "10.0.0.0/9", "10.128.0.0/9", "10.1.2.3/32", "127.0.0.0/8", "127.0.0.1/32",
    "198.18.0.0/15", "198.18.0.0/24", "169.254.169.254/32", "0.0.0.0/0",
]  # fmt: skip
NETS6 = ["2001:db8::/32", "2001:db8::/64", "2001:db8::1/128", "fc00::/7", "::1/128"]
ADDR_RULES = st.builds(
    lambda net, form: form(ipaddress.ip_network(net)),
    st.sampled_from(NETS4 + NETS6),
    st.sampled_from(
        [
            lambda n: str(n) if n.num_addresses > 1 else _lit(n),
            lambda n: (str(n) if n.num_addresses > 1 else _lit(n)) + ":*",
            lambda n: _lit(n) + ":22" if n.num_addresses == 1 else str(n),
            lambda n: "https://" + _lit(n) if n.num_addresses == 1 else str(n) + ":*",
            lambda n: "http://" + _lit(n) + ":8080" if n.num_addresses == 1 else str(n),
        ]
    ),
)
NAME_RULES = st.sampled_from(["a.test", "*.b.test", "a.test:22", "https://c.test", "c.test:*"])
RULES = st.one_of(ADDR_RULES, NAME_RULES)
GUARDS = st.builds(
    lambda private, extra, local, exempt: AddressGuard(
        reserve_private=private,
        extra=tuple(ipaddress.ip_network(n) for n in extra),
        host_local=frozenset(ipaddress.ip_address(a) for a in local),
        exempt=frozenset((ipaddress.ip_address(a), p) for a, p in exempt),
    ),
    st.booleans(),
    st.lists(st.sampled_from(["203.0.113.0/25", "10.128.0.0/9", "2001:db8::/64"]), max_size=2),
    st.lists(st.sampled_from(["203.0.113.7", "198.18.0.1", "2001:db8::1"]), max_size=2),
    st.lists(
        st.tuples(st.sampled_from(["127.0.0.1", "10.1.2.3"]), st.sampled_from([22, 443, 8080])),
        max_size=2,
    ),
)
TARGETS = st.tuples(
    st.sampled_from(["a.test", "x.b.test", "c.test", "d.test"]),
    st.sampled_from(["http", "https"]),
    st.sampled_from([22, 80, 443, 8080, 9999]),
)


def _lit(net: IPNetwork) -> str:
    addr = net.network_address
    return str(addr) if addr.version == 4 else f"[{addr}]"


def _candidates(policy: Policy, guard: AddressGuard) -> list[IPAddress]:
    """Every address that could be a witness: the edges of every network in play, and one
    past each (a difference of prefixes is a union of ranges that start or end there)."""
    nets: list[IPNetwork] = [r.network for r in (*policy.allow_rules, *policy.block_rules)
                             if r.network is not None]  # fmt: skip
    nets += [n for _, group in ALWAYS_RESERVED for n in group]
    nets += [*PRIVATE_NETWORKS, *guard.extra]
    found: set[IPAddress] = {a for a, _ in guard.exempt} | set(guard.host_local)
    for net in nets:
        first, last = int(net.network_address), int(net.broadcast_address)
        for n in (first - 1, first, last, last + 1):
            if 0 <= n < 2**net.max_prefixlen:
                found.add(ipaddress.ip_address(n) if net.version == 4 else ipaddress.IPv6Address(n))
    return sorted(found, key=lambda a: (a.version, int(a)))


@settings(max_examples=400, deadline=None)
@given(
    allow=st.lists(RULES, max_size=4),
    block=st.lists(RULES, max_size=3),
    opt_in=st.booleans(),
    guard=GUARDS,
    target=TARGETS,
)
def test_no_lookup_means_final_and_lookup_means_some_address_allows(
    allow: list[str],
    block: list[str],
    opt_in: bool,
    guard: AddressGuard,
    target: tuple[str, Scheme, int],
) -> None:
    policy = Policy(allow=allow, block=block, resolve_names_for_address_rules=opt_in)
    name = make_target(target[1], target[0], target[2])
    first = judge(policy, guard, name)
    if first.allowed:
        return  # an allowed name is resolved: the guard and block CIDRs judge its addresses
    candidates = _candidates(policy, guard)
    admits = [a for a in candidates if judge(policy, guard, name, (a,)).allowed]
    if not first.needs_addrs:
        assert admits == [], f"refused without a lookup, yet {admits[0]} would be allowed"
    else:
        assert opt_in, "without the opt-in no refusal waits for addresses"
        assert admits, "a lookup for a refusal no address could change"
    # the DNS responder answers a name only if some port of it could be allowed
    if not judge_name(policy, target[0], guard).allowed:
        for scheme in ("http", "https"):
            for port in (22, 80, 443, 8080, 9999):
                other = make_target(scheme, target[0], port)  # type: ignore[arg-type]
                assert not judge(policy, guard, other).allowed
                assert not judge(policy, guard, other).needs_addrs, (scheme, port)


def test_check_lint_and_a_sandbox_keep_the_opt_in(
    tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    from pathlib import Path

    from egress.boundary.sandboxes import with_routes
    from egress.cli import main
    from egress.policy.rules import parse_framework_route

    policy = Path(str(tmp_path)) / "p.toml"
    policy.write_text('resolve_names_for_address_rules = true\nallow = ["198.18.0.0/15"]\n')
    args = ["check", "--lint", "--policy", str(policy), "--resolve", "a.test=198.18.0.5"]
    assert main([*args, "a.test", "a.test:22"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("lint: policy key 'resolve_names_for_address_rules': ")
    assert out[1:] == [
        "allow a.test allow_rule: allowed by rule '198.18.0.0/15'",
        # no address rule covers port 22: not even a pinned name is resolved for it
        "block a.test:22 default_deny: no allow rule matches (default deny)",
    ]
    opted = Policy(allow=["198.18.0.0/15"], resolve_names_for_address_rules=True)
    route = parse_framework_route("http://198.18.0.1:8080")
    assert with_routes(opted, [route]).resolve_names_for_address_rules
    assert not with_routes(Policy(), [route]).resolve_names_for_address_rules

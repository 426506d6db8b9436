"""Where allow address rules could still admit a name (egress/policy/reach.py): what the
proxy resolves a name for, under the opt-in `resolve_names_for_address_rules`
(docs/policy.md#no-lookup-decides-nothing). The reach may over-approximate (a lookup too
many), never under-approximate (a refusal an address would have turned into an allow), and
is exact for IPv4: checked here against every address of small networks."""

from __future__ import annotations

import ipaddress

from hypothesis import given, settings
from hypothesis import strategies as st

from egress.policy.addrs import AddressGuard
from egress.policy.grammar import Rule, parse_rule
from egress.policy.reach import NOWHERE, address_reach, rule_pairs
from egress.policy.target import Scheme

SPACE = ipaddress.ip_network("198.18.0.0/26")
PAIRS: list[tuple[Scheme, int]] = [
    (scheme, port) for scheme in ("http", "https") for port in (80, 443, 8080, 22)
]
NET = st.builds(
    lambda host, length: ipaddress.ip_network(f"198.18.0.{host}/{length}", strict=False),
    st.integers(0, 63),
    st.integers(27, 32),
)


def spelled(net: ipaddress.IPv4Network, port: str) -> str:
    """A rule's text: an address may take a port, a CIDR only `:*` (docs/policy.md)."""
    if net.num_addresses == 1:
        return f"{net.network_address}{port}"
    return f"{net}{port if port == ':*' else ''}"


def rules(texts: list[str], action: str) -> list[Rule]:
    return [parse_rule(t, action) for t in texts]  # type: ignore[arg-type]


def admitted(allows: list[Rule], blocks: list[Rule], pair: tuple[Scheme, int]) -> bool:
    """A scan of every address: does some address of an allow rule covering `pair` escape
    every block rule covering it?"""
    for address in SPACE:
        allowed = any(r.covers_port(*pair) and address in r.network for r in allows)  # type: ignore[operator]
        blocked = any(b.covers_port(*pair) and address in b.network for b in blocks)  # type: ignore[operator]
        if allowed and not blocked:
            return True
    return False


@settings(max_examples=300)
@given(
    st.lists(st.tuples(NET, st.sampled_from(["", ":443", ":8080", ":*"])), max_size=3),
    st.lists(st.tuples(NET, st.sampled_from(["", ":443", ":8080", ":*"])), max_size=3),
)
def test_the_reach_is_exact_for_ipv4(
    allow: list[tuple[ipaddress.IPv4Network, str]], block: list[tuple[ipaddress.IPv4Network, str]]
) -> None:
    allows = rules([spelled(net, port) for net, port in allow], "allow")
    blocks = rules([spelled(net, port) for net, port in block], "block")
    reach = address_reach(allows, blocks)
    for pair in PAIRS:
        assert reach.covers(*pair) is admitted(allows, blocks, pair), pair


def test_an_allow_rule_reaches_its_own_ports_only() -> None:
    assert rule_pairs(parse_rule("198.18.0.0/24", "allow")) == {("http", 80), ("https", 443)}
    assert rule_pairs(parse_rule("198.18.0.1:8443", "allow")) == {
        ("http", 8443),
        ("https", 8443),
    }
    assert rule_pairs(parse_rule("198.18.0.0/24:*", "allow")) is None


def test_a_rule_the_guard_reserves_whole_reaches_nothing() -> None:
    allows = rules(["127.0.0.0/8", "10.0.0.0/8"], "allow")
    assert address_reach(allows, []).covers("https", 443)  # no guard: the rules alone
    private = AddressGuard(reserve_private=True)
    assert address_reach(allows, [], private).empty
    assert address_reach(allows, [], AddressGuard()).rules == (allows[1],)


def test_an_exempt_endpoint_opens_its_own_port_only() -> None:
    loopback = ipaddress.ip_address("127.0.0.1")
    guard = AddressGuard(exempt=frozenset({(loopback, 8080)}))
    reach = address_reach(rules(["127.0.0.1:*"], "allow"), [], guard)
    assert reach.covers("http", 8080)
    assert not reach.covers("http", 8081)
    assert not reach.covers("https", 443)


def test_nowhere_is_empty() -> None:
    assert NOWHERE.empty
    assert not any(NOWHERE.covers(*pair) for pair in PAIRS)

"""The indexes of a rule set (egress/policy/index.py): what they find is what a scan of
every rule in definition order finds, for names (exact, `*.suffix`, other patterns) and for
addresses (rules by prefix length)."""

import fnmatch
import ipaddress

from hypothesis import given
from hypothesis import strategies as st

from egress.policy.grammar import Rule, parse_rule
from egress.policy.index import RuleSet

LABEL = st.sampled_from(["a", "b", "api", "x-1", "eu"])
HOST = st.lists(LABEL, min_size=1, max_size=4).map(lambda ls: ".".join([*ls, "test"]))
PATTERN = st.one_of(
    HOST,
    HOST.map(lambda h: "*." + h),
    HOST.map(lambda h: h.replace("a", "?", 1)),
    HOST.map(lambda h: "api.*." + h),
    st.sampled_from(["*.test", "a*.test", "*"]),
)


def rule_set(texts: list[str]) -> tuple[RuleSet, list[Rule]]:
    rules = [parse_rule(t, "allow") for t in texts]
    found = RuleSet()
    for rule in rules:
        found.add(rule)
    return found, rules


def names_a(rule: Rule, host: str) -> bool:
    """The rule's pattern as docs/policy.md says: shell-style, a leading `*.` also the apex."""
    pat = rule.pattern or ""
    return fnmatch.fnmatchcase(host, pat) or (
        pat.startswith("*.") and fnmatch.fnmatchcase(host, pat[2:])
    )


@given(st.lists(PATTERN, max_size=8), HOST)
def test_host_index_agrees_with_a_scan(texts: list[str], host: str) -> None:
    index, rules = rule_set(texts)
    naive = [r.text for r in rules if names_a(r, host)]
    # identical rules are one rule (the first of them decides either way)
    assert list(dict.fromkeys(r.text for r in index.host_matches(host))) == list(
        dict.fromkeys(naive)
    )


def test_a_suffix_rule_names_its_apex_and_nothing_beside_it() -> None:
    index, _ = rule_set(["*.example.test", "example.test", "*.other.test"])
    assert [r.text for r in index.host_matches("example.test")] == [
        "*.example.test",
        "example.test",
    ]
    assert [r.text for r in index.host_matches("a.b.example.test")] == ["*.example.test"]
    assert index.host_matches("badexample.test") == []
    assert index.host_matches("example.test.evil.test") == []


NETS = st.one_of(
    st.builds(
        lambda a, p: ipaddress.ip_network((a, p), strict=False),
        st.integers(0, 2**32 - 1),
        st.integers(0, 32),
    ),
    st.builds(
        lambda a, p: ipaddress.ip_network((a, p), strict=False),
        st.integers(0, 2**128 - 1),
        st.integers(0, 128),
    ),
)
ADDRS = st.one_of(
    st.integers(0, 2**32 - 1).map(ipaddress.IPv4Address),
    st.integers(0, 2**128 - 1).map(ipaddress.IPv6Address),
)


@given(st.lists(NETS, max_size=12), st.lists(ADDRS, min_size=1, max_size=4), st.booleans())
def test_address_index_agrees_with_a_scan(
    nets: list[ipaddress.IPv4Network | ipaddress.IPv6Network],
    ips: list[ipaddress.IPv4Address | ipaddress.IPv6Address],
    every: bool,
) -> None:
    index, every_rule = rule_set([str(n) for n in nets])
    rules = index.network_matches(ips, every=every)
    naive = [
        r
        for r in every_rule
        if (all if every else any)(ip in r.network for ip in ips)  # type: ignore[operator]
    ]
    # identical rules are one rule (the first of them decides either way)
    assert [r.text for r in rules] == list(dict.fromkeys(r.text for r in naive))

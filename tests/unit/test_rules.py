"""The policy engine (egress/policy/rules.py): rule forms, ports, precedence, and
block-always-wins. A rule's own parse is test_grammar.py, the indexes test_index.py."""

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from egress.errors import PolicyError
from egress.policy.rules import Policy
from egress.policy.target import Target, make_target


def connect(host: str, port: int = 443) -> Target:
    return make_target("https", host, port)


def http(host: str, port: int = 80) -> Target:
    return make_target("http", host, port)


# (id, allow rules, target, allowed?)
RULE_TABLE = [
    # host pattern
    ("exact", ["example.com"], connect("example.com"), True),
    ("exact-case", ["EXAMPLE.COM."], connect("example.com"), True),
    ("exact-not-sub", ["example.com"], connect("api.example.com"), False),
    ("star-sub", ["*.example.com"], connect("api.example.com"), True),
    ("star-deep", ["*.example.com"], connect("a.b.example.com"), True),
    ("star-apex", ["*.example.com"], connect("example.com"), True),
    ("star-not-bad", ["*.example.com"], connect("badexample.com"), False),
    ("star-not-suffix-trick", ["*.example.com"], connect("example.com.evil.org"), False),
    ("question", ["api-?.example.com"], connect("api-1.example.com"), True),
    ("question-one-char", ["api-?.example.com"], connect("api-12.example.com"), False),
    ("middle-star", ["api.*.example.com"], connect("api.eu.example.com"), True),
    ("unicode-rule", ["bücher.example"], connect("xn--bcher-kva.example"), True),
    ("unicode-target", ["xn--bcher-kva.example"], connect("BÜCHER.example"), True),
    # host pattern + port
    ("port", ["example.com:8443"], connect("example.com", 8443), True),
    ("port-http-too", ["example.com:8443"], http("example.com", 8443), True),
    ("port-not-443", ["example.com:8443"], connect("example.com"), False),
    # URL origin
    ("url-https", ["https://api.example.com"], connect("api.example.com"), True),
    ("url-https-not-http", ["https://api.example.com"], http("api.example.com", 443), False),
    ("url-http", ["http://api.example.com"], http("api.example.com"), True),
    ("url-http-not-connect", ["http://api.example.com"], connect("api.example.com", 80), False),
    ("url-port", ["http://*.svc.local:8080"], http("a.svc.local", 8080), True),
    ("url-port-other", ["http://*.svc.local:8080"], http("a.svc.local", 80), False),
    ("url-star-apex", ["https://*.example.com"], connect("example.com"), True),
    ("url-path-ignored", ["https://example.com/only/this"], connect("example.com"), True),
    # IP literal / CIDR
    ("ip", ["203.0.113.7"], connect("203.0.113.7"), True),
    ("ip-spelling", ["203.0.113.7"], connect("3405803783"), True),
    ("cidr", ["203.0.113.0/24"], connect("203.0.113.99"), True),
    ("cidr-miss", ["203.0.113.0/24"], connect("203.0.114.1"), False),
    ("v6-bracket", ["[2001:db8::1]"], connect("2001:db8::1"), True),
    ("v6-cidr", ["2001:db8::/32"], connect("[2001:db8:ffff::1]"), True),
    ("v4-rule-mapped-target", ["203.0.113.7"], connect("::ffff:203.0.113.7"), True),
    # default ports of an allow rule
    ("allow-connect-443", ["example.com"], connect("example.com", 443), True),
    ("allow-http-80", ["example.com"], http("example.com", 80), True),
    ("allow-connect-22", ["example.com"], connect("example.com", 22), False),
    ("allow-http-443", ["example.com"], http("example.com", 443), False),
    ("allow-connect-80", ["example.com"], connect("example.com", 80), False),
]


@pytest.mark.parametrize(
    ("allow", "target", "allowed"), [r[1:] for r in RULE_TABLE], ids=[r[0] for r in RULE_TABLE]
)
def test_rule_forms(allow: list[str], target: Target, allowed: bool) -> None:
    assert Policy(allow=allow).decide(target).allowed is allowed


@pytest.mark.parametrize(
    "target",
    [connect("evil.com"), connect("evil.com", 22), http("evil.com", 8080), http("sub.evil.com")],
    ids=["443", "22", "http-8080", "sub"],
)
def test_block_without_port_blocks_everything(target: Target) -> None:
    policy = Policy(block=["*.evil.com"], default="allow")
    d = policy.decide(target)
    assert (d.allowed, d.reason, d.rule) == (False, "block_rule", "*.evil.com")


def test_default_allow_any_port() -> None:
    d = Policy(default="allow").decide(connect("example.com", 22))
    assert (d.allowed, d.reason, d.rule) == (True, "default_allow", None)


def test_default_deny_has_null_rule() -> None:
    d = Policy().decide(connect("example.com"))
    assert (d.allowed, d.reason, d.rule) == (False, "default_deny", None)


def test_port_not_allowed_names_the_rule() -> None:
    d = Policy(allow=["*.example.com"]).decide(connect("example.com", 22))
    assert (d.allowed, d.reason, d.rule) == (False, "port_not_allowed", None)
    assert "*.example.com" in d.detail


def test_block_beats_allow() -> None:
    policy = Policy(allow=["*.example.com"], block=["evil.example.com"])
    assert policy.decide(connect("api.example.com")).allowed
    d = policy.decide(http("evil.example.com"))
    assert (d.allowed, d.rule) == (False, "evil.example.com")


def test_framework_route_beats_block() -> None:
    policy = Policy(
        block=["127.0.0.0/8", "localhost"], framework_routes=["http://127.0.0.1:8080/v1"]
    )
    for target in (http("127.0.0.1", 8080), connect("127.0.0.1", 8080)):
        d = policy.decide(target)
        assert (d.allowed, d.reason) == (True, "framework_route")
    assert not policy.decide(http("127.0.0.1", 8081)).allowed


def test_cidr_block_matches_any_resolved_address() -> None:
    policy = Policy(allow=["example.com"], block=["198.51.100.0/24"])
    t = connect("example.com")
    first = policy.decide(t)
    assert first.allowed
    assert first.needs_addrs
    addrs = [ipaddress.ip_address("203.0.113.1"), ipaddress.ip_address("198.51.100.9")]
    assert policy.decide(t, addrs).reason == "block_rule"


def test_cidr_allow_needs_every_address() -> None:
    # only under the opt-in does an allow address rule judge a name's addresses
    # (docs/policy.md#no-lookup-decides-nothing)
    policy = Policy(allow=["203.0.113.0/24"], resolve_names_for_address_rules=True)
    t = connect("example.com")
    assert policy.decide(t).needs_addrs
    inside = [ipaddress.ip_address("203.0.113.1")]
    mixed = [*inside, ipaddress.ip_address("198.51.100.1")]
    assert policy.decide(t, inside).allowed
    assert not policy.decide(t, mixed).allowed


def test_cidr_allow_admits_addresses_not_names() -> None:
    """Without the opt-in a name resolving into an allowed CIDR is refused, and its refusal
    needs no lookup; the address itself is allowed."""
    policy = Policy(allow=["203.0.113.0/24"])
    t = connect("example.com")
    first = policy.decide(t)
    assert (first.allowed, first.reason, first.needs_addrs) == (False, "default_deny", False)
    inside = [ipaddress.ip_address("203.0.113.1")]
    assert policy.decide(t, inside).reason == "default_deny"
    assert policy.decide(connect("203.0.113.1")).allowed


def test_bad_default() -> None:
    with pytest.raises(PolicyError, match="default"):
        Policy(default="maybe")  # type: ignore[arg-type]


LABEL = st.text(alphabet="abcxyz0123-", min_size=1, max_size=6).filter(
    lambda s: not s.startswith("-") and not s.endswith("-")
)
HOST = st.lists(LABEL, min_size=1, max_size=4).map(lambda ls: ".".join([*ls, "test"]))
PATTERN = st.one_of(
    HOST,
    HOST.map(lambda h: "*." + h),
    HOST.map(lambda h: h + ":8443"),
    HOST.map(lambda h: "https://" + h),
    st.sampled_from(["*", "*.test"]),
)


@given(
    st.lists(PATTERN, max_size=5),
    PATTERN,
    HOST,
    st.sampled_from(["http", "https"]),
    st.sampled_from([80, 443, 8443, 22]),
    st.sampled_from(["deny", "allow"]),
)
def test_block_always_wins(
    allow: list[str], block: str, host: str, scheme: str, port: int, default: str
) -> None:
    target = make_target(scheme, host, port)  # type: ignore[arg-type]
    blocker = Policy(block=[block])
    if not blocker.decide(target).reason == "block_rule":
        return
    policy = Policy(allow=[*allow, block, host], block=[block], default=default)  # type: ignore[arg-type]
    d = policy.decide(target)
    assert not d.allowed
    assert d.reason == "block_rule"


def test_partial_address_allow_is_default_deny_not_port() -> None:
    policy = Policy(allow=["203.0.113.0/24"], resolve_names_for_address_rules=True)
    t = connect("example.com")
    mixed = [ipaddress.ip_address("203.0.113.1"), ipaddress.ip_address("198.51.100.1")]
    assert policy.decide(t, mixed).reason == "default_deny"
    inside = [ipaddress.ip_address("203.0.113.1")]
    assert policy.decide(connect("example.com", 22), inside).reason == "port_not_allowed"

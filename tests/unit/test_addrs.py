"""The pure address guard: every reserved range, every IPv4-in-IPv6 wrapping."""

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from egress.policy.addrs import AddressGuard, classify, parse_cidr
from egress.policy.judge import judge
from egress.policy.rules import Policy
from egress.policy.target import make_target

CASES = [
    ("loopback", "127.0.0.1", "loopback"),
    ("loopback-range", "127.255.0.9", "loopback"),
    ("loopback6", "::1", "loopback"),
    ("unspecified", "0.0.0.0", "unspecified"),
    ("zero-net", "0.1.2.3", "unspecified"),
    ("unspecified6", "::", "unspecified"),
    ("link-local", "169.254.169.254", "link_local"),
    ("link-local6", "fe80::1", "link_local"),
    ("multicast", "224.0.0.1", "multicast"),
    ("multicast6", "ff02::1", "multicast"),
    ("broadcast", "255.255.255.255", "broadcast"),
    ("class-e", "240.0.0.1", "reserved"),
    ("alibaba-meta", "100.100.100.200", "metadata"),
    ("azure-wire", "168.63.129.16", "metadata"),
    ("oracle-meta", "192.0.0.192", "metadata"),
    ("aws-v6-meta", "fd00:ec2::254", "metadata"),
    ("mapped", "::ffff:127.0.0.1", "loopback"),
    ("compat", "::127.0.0.1", "loopback"),
    ("nat64", "64:ff9b::7f00:1", "loopback"),
    ("nat64-meta", "64:ff9b::a9fe:a9fe", "link_local"),
    ("nat64-local-96", "64:ff9b:1::7f00:1", "loopback"),
    ("6to4", "2002:7f00:1::1", "loopback"),
    ("6to4-meta", "2002:a9fe:a9fe::", "link_local"),
    ("teredo-client", "2001:0:4136:e378:8000:63bf:80ff:fffe", "loopback"),
    ("isatap", "2001:db8::5efe:7f00:1", "loopback"),
    ("public", "203.0.113.7", None),
    ("benchmark-range-ok", "198.18.0.2", None),
    ("rfc1918-default-ok", "10.1.2.3", None),
    ("public6", "2001:db8::1", None),
]


@pytest.mark.parametrize(("addr", "want"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_classify(addr: str, want: str | None) -> None:
    assert classify(ipaddress.ip_address(addr)) == want


@pytest.mark.parametrize(
    ("addr", "want"),
    [
        ("10.0.0.1", "private"),
        ("172.16.5.5", "private"),
        ("192.168.1.1", "private"),
        ("100.64.0.1", "private"),
        ("fd12::1", "private"),
        ("::ffff:10.0.0.1", "private"),
        ("203.0.113.1", None),
    ],
)
def test_reserve_private(addr: str, want: str | None) -> None:
    assert AddressGuard(reserve_private=True).classify(ipaddress.ip_address(addr)) == want


def test_host_local_and_extra() -> None:
    guard = AddressGuard(
        host_local=frozenset({ipaddress.ip_address("198.18.0.1")}),
        extra=(parse_cidr("203.0.113.0/24"),),
    )
    assert guard.classify(ipaddress.ip_address("198.18.0.1")) == "host_local"
    assert guard.classify(ipaddress.ip_address("::ffff:198.18.0.1")) == "host_local"
    assert guard.classify(ipaddress.ip_address("203.0.113.5")) == "reserved_extra"
    assert guard.classify(ipaddress.ip_address("198.18.0.2")) is None


def test_exempt_endpoint_passes_only_that_port_and_never_by_default() -> None:
    """An exempt `(address, port)` lets exactly that endpoint through the guard (a test
    rig's loopback upstream) while the policy still decides; the default exempts nothing."""
    lo = ipaddress.ip_address("127.0.0.1")
    policy = Policy(allow=["up.test:8081", "up.test:8082"], block=["bad.test"])
    guard = AddressGuard(exempt=frozenset({(lo, 8081)}))
    assert AddressGuard().exempt == frozenset()
    assert AddressGuard().check([lo], 8081) == (lo, "loopback")
    assert guard.check([lo], 8081) is None
    assert guard.check([lo], 8082) == (lo, "loopback")
    assert guard.check([lo]) == (lo, "loopback")  # no port given: no exemption
    assert guard.classify(lo) == "loopback"
    assert judge(policy, guard, make_target("http", "up.test", 8081), [lo]).allowed
    refused = judge(policy, guard, make_target("http", "up.test", 8082), [lo])
    assert (refused.allowed, refused.reason) == (False, "reserved_address")
    blocked = judge(policy, guard, make_target("http", "bad.test", 8081), [lo])
    assert (blocked.allowed, blocked.reason) == (False, "block_rule")
    # a second, reserved address of the same name is still refused
    six = ipaddress.ip_address("::1")
    both = judge(policy, guard, make_target("http", "up.test", 8081), [lo, six])
    assert (both.allowed, both.reason) == (False, "reserved_address")
    assert guard.with_host_local([ipaddress.ip_address("198.18.0.1")]).exempt == guard.exempt


@pytest.mark.parametrize(
    "exempt",
    [
        {(ipaddress.ip_address("127.0.0.1"), 80)},
        frozenset({("127.0.0.1", 80)}),
        frozenset({(ipaddress.ip_address("127.0.0.1"), "80")}),
        frozenset({(ipaddress.ip_address("127.0.0.1"), 0)}),
        frozenset({(ipaddress.ip_address("127.0.0.1"), True)}),
    ],
)
def test_exempt_is_typed(exempt: object) -> None:
    with pytest.raises(TypeError, match="exempt must be a frozenset of"):
        AddressGuard(exempt=exempt)  # type: ignore[arg-type]


def test_parse_cidr_error_quotes() -> None:
    with pytest.raises(ValueError, match="'nope'"):
        parse_cidr("nope")


@given(st.integers(0, 2**32 - 1))
def test_every_wrapping_judged_as_ipv4(n: int) -> None:
    v4 = ipaddress.IPv4Address(n)
    want = classify(v4)
    for wrapped in (
        ipaddress.IPv6Address((0xFFFF << 32) | n),  # mapped
        ipaddress.IPv6Address((0x0064FF9B << 96) | n),  # NAT64
        ipaddress.IPv6Address((0x2002 << 112) | (n << 80)),  # 6to4
    ):
        got = classify(wrapped)
        if want is not None:
            assert got == want


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1",
        "2130706433",
        "0177.0.0.1",
        "0x7f.1",
        "127.1",
        "::ffff:127.0.0.1",
        "[::1]",
        "0.0.0.0",
        "169.254.169.254",
        "[64:ff9b::7f00:1]",
    ],
)
def test_guard_beats_allow_and_default(host: str) -> None:
    policy = Policy(allow=["0.0.0.0/0", "::/0", host], default="allow")
    d = judge(policy, AddressGuard(), make_target("https", host, 443))
    assert (d.allowed, d.reason) == (False, "reserved_address")


def test_framework_route_may_reach_loopback() -> None:
    policy = Policy(framework_routes=["http://127.0.0.1:8080"])
    d = judge(policy, AddressGuard(), make_target("http", "2130706433", 8080))
    assert (d.allowed, d.reason) == (True, "framework_route")


def test_resolved_loopback_refused() -> None:
    policy = Policy(allow=["example.test"])
    t = make_target("https", "example.test", 443)
    d = judge(policy, AddressGuard(), t, [ipaddress.ip_address("127.0.0.1")])
    assert d.reason == "reserved_address"

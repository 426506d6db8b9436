"""Normalization: every spelling of a host becomes the one canonical string."""

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from egress.errors import TargetError
from egress.policy.target import (
    normalize_host,
    parse_authority,
    parse_inet_aton,
    parse_url,
)

CANONICAL = [
    ("decimal-int", "2130706433", "127.0.0.1"),
    ("octal", "0177.0.0.1", "127.0.0.1"),
    ("hex-two-part", "0x7f.1", "127.0.0.1"),
    ("short", "127.1", "127.0.0.1"),
    ("three-part", "10.1.258", "10.1.1.2"),
    ("hex-full", "0x7F000001", "127.0.0.1"),
    ("mapped-v6", "::ffff:127.0.0.1", "127.0.0.1"),
    ("mapped-v6-bracket", "[::ffff:7f00:1]", "127.0.0.1"),
    ("v6-brackets", "[::1]", "::1"),
    ("v6-zone", "fe80::1%eth0", "fe80::1"),
    ("v6-bracket-zone", "[fe80::1%25eth0]", "fe80::1"),
    ("v6-long", "2001:0DB8:0000::0001", "2001:db8::1"),
    ("upper-trailing-dot", "EXAMPLE.com.", "example.com"),
    ("ipv4-trailing-dot", "127.0.0.1.", "127.0.0.1"),
    ("unicode", "bücher.example", "xn--bcher-kva.example"),
    ("unicode-upper", "BÜCHER.example", "xn--bcher-kva.example"),
    ("already-alabel", "xn--bcher-kva.example", "xn--bcher-kva.example"),
    ("underscore", "_srv.Example.COM", "_srv.example.com"),
    ("fullwidth-dot-free", "ｅｘａｍｐｌｅ.com", "example.com"),
]


@pytest.mark.parametrize(("raw", "want"), [c[1:] for c in CANONICAL], ids=[c[0] for c in CANONICAL])
def test_canonical(raw: str, want: str) -> None:
    assert normalize_host(raw) == want


REFUSED = [
    ("empty", ""),
    ("only-dot", "."),
    ("empty-label", "a..example.com"),
    ("leading-dot", ".example.com"),
    ("two-trailing-dots", "example.com.."),
    ("slash", "evil.com/.example.com"),
    ("hash", "evil.com#.example.com"),
    ("backslash", "evil.com\\.example.com"),
    ("percent", "evil%2ecom"),
    ("at", "user@example.com"),
    ("space", "exa mple.com"),
    ("tab", "example.com\t"),
    ("newline", "example.com\n"),
    ("leading-space", " 127.0.0.1"),
    ("long-label", "a" * 64 + ".com"),
    ("long-name", ".".join(["a" * 60] * 5)),
    ("bad-ipv4-numeric-tld", "1.2.3.256"),
    ("five-parts", "1.2.3.4.5"),
    ("octal-bad-digit", "08.0.0.1"),
    ("numeric-tld", "example.123"),
    ("hex-tld", "example.0x10"),
    ("bad-v6", "[::g]"),
    ("unbracketed-junk-v6", "1:2"),
    ("nul", "exa\x00mple.com"),
]


@pytest.mark.parametrize("raw", [c[1] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_refused(raw: str) -> None:
    with pytest.raises(TargetError):
        normalize_host(raw)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("0", "0.0.0.0"),
        ("0x", "0.0.0.0"),
        ("4294967295", "255.255.255.255"),
        ("1.0xffffff", "1.255.255.255"),
        ("4294967296", None),
        ("1.2.3.0400", None),
        ("0x100.1.1.1", None),
        ("1..1", None),
        ("", None),
        ("1.2.65536", None),
    ],
)
def test_inet_aton_edges(text: str, want: str | None) -> None:
    got = parse_inet_aton(text)
    assert (str(got) if got else None) == want


@given(st.integers(0, 2**32 - 1))
def test_every_ipv4_spelling_is_its_dotted_quad(n: int) -> None:
    addr = ipaddress.IPv4Address(n)
    dotted = str(addr)
    b = addr.packed
    for spelling in (
        str(n),
        hex(n),
        f"{b[0]}.{(n & 0xFFFFFF)}",
        f"0{b[0]:o}.{b[1]}.{b[2]}.{b[3]}",
        f"{b[0]}.{b[1]}.{(b[2] << 8) | b[3]}",
        f"::ffff:{dotted}",
    ):
        assert normalize_host(spelling) == dotted


HOSTISH = st.text(alphabet=st.sampled_from("abcXYZ019-_.ü*:[]%/@ \t0x"), min_size=0, max_size=40)


@given(HOSTISH)
def test_normalize_is_idempotent_or_refuses(raw: str) -> None:
    try:
        once = normalize_host(raw)
    except TargetError:
        return
    assert normalize_host(once) == once
    assert once == once.lower()
    assert not set(once) & set("/#\\%@ \t[]")


@pytest.mark.parametrize(
    ("text", "host", "port"),
    [
        ("example.com:443", "example.com", 443),
        ("[::1]:8443", "::1", 8443),
        ("EXAMPLE.COM.:22", "example.com", 22),
        ("2130706433:80", "127.0.0.1", 80),
    ],
)
def test_authority(text: str, host: str, port: int) -> None:
    t = parse_authority(text)
    assert (t.scheme, t.host, t.port) == ("https", host, port)


@pytest.mark.parametrize(
    "text",
    [
        "example.com",
        "example.com:",
        "::1:443",
        "[::1]",
        "u@example.com:443",
        "example.com:0",
        "example.com:65536",
        "example.com:+443",
        "example.com:४४३",
        "[::1]x:443",
    ],
)
def test_authority_refused(text: str) -> None:
    with pytest.raises(TargetError):
        parse_authority(text)


@pytest.mark.parametrize(
    ("url", "host", "port", "path"),
    [
        ("http://Example.com/a?b=1", "example.com", 80, "/a?b=1"),
        ("http://example.com", "example.com", 80, "/"),
        ("http://example.com:8080?x", "example.com", 8080, "/?x"),
        ("http://[::1]:81/", "::1", 81, "/"),
        ("HTTP://example.com/#frag", "example.com", 80, "/"),
    ],
)
def test_url(url: str, host: str, port: int, path: str) -> None:
    p = parse_url(url)
    assert (p.target.host, p.target.port, p.path) == (host, port, path)


@pytest.mark.parametrize(
    "url",
    [
        "http://user:pw@example.com/",
        "http://@example.com/",
        "https://example.com/",
        "/path",
        "ftp://example.com/",
        "http:///x",
        "http://evil.com\\@good.com/",
    ],
)
def test_url_refused(url: str) -> None:
    with pytest.raises(TargetError):
        parse_url(url)


def test_canonical_addresses_from_getaddrinfo() -> None:
    from egress.policy.target import canonical_addresses

    got = canonical_addresses(["127.0.0.1", "::ffff:127.0.0.1", "fe80::1%eth0", "::1", "::1"])
    assert [str(a) for a in got] == ["127.0.0.1", "fe80::1", "::1"]

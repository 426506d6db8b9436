"""The sans-I/O SOCKS5 parsers: whole, byte by byte, trailing bytes, and hypothesis
(invariant: parse it, need more, or raise SocksError, nothing else)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from egress.proxy.codec import socks5
from egress.proxy.codec.socks5 import SocksError

Parser = Callable[[bytes], Any]
PARSERS: list[Parser] = [socks5.parse_greeting, socks5.parse_credentials, socks5.parse_request]


def feed_bytewise(parse: Parser, data: bytes) -> Any:
    """Feed `data` one byte more at a time: None until complete, then the same answer."""
    for i in range(len(data)):
        assert parse(data[:i]) is None, data[:i]
    return parse(data)


@pytest.mark.parametrize(
    ("data", "methods"),
    [(b"\x05\x01\x00", {0}), (b"\x05\x02\x00\x02", {0, 2}), (b"\x05\x01\x02", {2})],
    ids=["none", "none+userpass", "userpass"],
)
def test_greeting(data: bytes, methods: set[int]) -> None:
    greeting, used = feed_bytewise(socks5.parse_greeting, data)
    assert greeting.methods == methods
    assert used == len(data)
    assert socks5.parse_greeting(data + b"junk") == (greeting, used)


@pytest.mark.parametrize(
    "data",
    [b"\x04\x01\x00", b"\x05\x00", b"GET / HTTP/1.1\r\n"],
    ids=["socks4", "no-methods", "http"],
)
def test_bad_greeting(data: bytes) -> None:
    with pytest.raises(SocksError) as info:
        socks5.parse_greeting(data)
    assert info.value.reply is None


def test_choose_method() -> None:
    both = socks5.Greeting(frozenset({0, 2}))
    none = socks5.Greeting(frozenset({0}))
    assert socks5.choose_method(both, require_auth=False) == socks5.METHOD_USERPASS
    assert socks5.choose_method(none, require_auth=False) == socks5.METHOD_NONE
    assert socks5.choose_method(none, require_auth=True) == socks5.METHOD_UNACCEPTABLE


def test_credentials_whole_and_bytewise() -> None:
    data = b"\x01\x05agent\x06s3cr3t"
    creds, used = feed_bytewise(socks5.parse_credentials, data)
    assert (creds.username, creds.password, used) == ("agent", "s3cr3t", len(data))
    assert "s3cr3t" not in repr(creds)
    with pytest.raises(SocksError):
        socks5.parse_credentials(b"\x05\x01a\x01b")
    with pytest.raises(SocksError):
        socks5.parse_credentials(b"\x01\x01\xff\x01b")


@pytest.mark.parametrize(
    ("host", "port", "atyp"),
    [
        ("example.com", 443, socks5.ATYP_DOMAIN),
        ("198.18.0.2", 22, socks5.ATYP_IPV4),
        ("2001:db8::1", 8443, socks5.ATYP_IPV6),
        ("2130706433", 80, socks5.ATYP_DOMAIN),  # an address spelling as a name: judged later
    ],
    ids=["name", "ipv4", "ipv6", "decimal-spelling"],
)
def test_request_roundtrip(host: str, port: int, atyp: int) -> None:
    data = socks5.serialize_request(host, port)
    request, used = feed_bytewise(socks5.parse_request, data)
    assert (request.host, request.port, request.atyp, used) == (host, port, atyp, len(data))
    assert socks5.parse_request(data + b"\x16\x03\x01") == (request, used)


@pytest.mark.parametrize(
    ("data", "reply", "reason"),
    [
        (socks5.serialize_request("a.test", 80, cmd=2), 0x07, "command_not_supported"),
        (socks5.serialize_request("a.test", 80, cmd=3), 0x07, "command_not_supported"),
        (b"\x05\x01\x00\x02abcd", 0x08, "address_type_not_supported"),
        (b"\x05\x01\x01\x01\x01\x02\x03\x04\x00\x50", 0x01, "bad_request"),
        (b"\x05\x01\x00\x03\x00\x00\x50", 0x01, "bad_request"),
        (b"\x05\x01\x00\x03\x02\xff\xfe\x00\x50", 0x01, "bad_request"),
        (b"\x05\x01\x00\x01\x01\x02\x03\x04\x00\x00", 0x01, "bad_request"),
        (b"\x04\x01\x00\x50", 0x01, "bad_request"),
    ],
    ids=["bind", "udp-associate", "atyp-2", "rsv", "empty-name", "not-utf8", "port-0", "v4"],
)
def test_request_refusals(data: bytes, reply: int, reason: str) -> None:
    with pytest.raises(SocksError) as info:
        socks5.parse_request(data)
    assert (info.value.reply, info.value.reason) == (reply, reason)


def test_reply_bytes_and_codes() -> None:
    assert socks5.reply(0) == b"\x05\x00\x00\x01\x00\x00\x00\x00\x00\x00"
    assert socks5.reply(5, ("2001:db8::1", 1080))[3] == socks5.ATYP_IPV6
    assert socks5.reply_for("block_rule") == socks5.reply_for("reserved_address") == 0x02
    assert socks5.reply_for("dns_error") == 0x04
    assert socks5.reply_for("connection_refused") == 0x05
    assert socks5.reply_for("upstream_error") == 0x01


@pytest.mark.parametrize("parse", PARSERS, ids=["greeting", "credentials", "request"])
@given(data=st.binary(max_size=300))
def test_fuzz_parse_or_protocol_error(parse: Parser, data: bytes) -> None:
    """Whole and every prefix: a message, None, or SocksError; a prefix of a parsed message
    never parses differently."""
    outcomes = []
    for i in range(len(data) + 1):
        try:
            outcomes.append(parse(data[:i]))
        except SocksError:
            outcomes.append("error")
    final = outcomes[-1]
    if final not in (None, "error"):
        _msg, used = final
        assert 0 < used <= len(data)
        assert all(o is None for o in outcomes[:used])
        assert all(o == final for o in outcomes[used:])


@given(
    host=st.one_of(
        st.ip_addresses().map(str),
        st.text(min_size=1, max_size=60).filter(lambda s: 0 < len(s.encode()) < 256),
    ),
    port=st.integers(1, 65535),
)
def test_fuzz_serialize_parse_roundtrip(host: str, port: int) -> None:
    request, _used = socks5.parse_request(socks5.serialize_request(host, port)) or (None, 0)
    assert request is not None
    assert request.port == port
    assert request.host == host or request.atyp != socks5.ATYP_DOMAIN

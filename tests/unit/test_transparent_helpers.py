"""Transparent mode's small pure helpers: the absolute form built from a redirected request,
and SO_ORIGINAL_DST's sockaddr_in."""

from __future__ import annotations

import socket
import struct

import pytest

from egress.proxy.modes.transparent import absolute_form, parse_sockaddr_in


@pytest.mark.parametrize(
    ("target", "host", "want"),
    [
        ("/a?b", "www.test", "http://www.test:80/a?b"),
        ("/", "www.test:8080", "http://www.test:80/"),  # the connection's port, not Host's
        ("/", None, "http://198.19.128.1:80/"),  # no Host: the fake-IP name or the address
        ("/", "[2001:db8::1]:80", "http://[2001:db8::1]:80/"),
        ("/", "evil.test/.www.test", None),
        ("/", "a@b.test", None),
        ("http://x.test/", "www.test", None),
        ("*", "www.test", None),
        ("x.test:443", "www.test", None),
    ],
    ids=[
        "origin",
        "host-port",
        "no-host",
        "v6",
        "slash",
        "userinfo",
        "absolute",
        "asterisk",
        "authority",
    ],
)
def test_absolute_form(target: str, host: str | None, want: str | None) -> None:
    assert absolute_form(target, host, "198.19.128.1", 80) == want


def test_parse_sockaddr_in() -> None:
    raw = struct.pack("=H", socket.AF_INET) + struct.pack("!H", 443) + bytes([198, 19, 128, 7])
    addr, port = parse_sockaddr_in(raw + b"\0" * 8) or (None, 0)
    assert (str(addr), port) == ("198.19.128.7", 443)
    assert parse_sockaddr_in(b"\0" * 16) is None
    assert parse_sockaddr_in(b"") is None

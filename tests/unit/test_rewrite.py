"""Tests for egress.proxy.codec.rewrite: heads as the proxy sends them on (hop-by-hop
fields removed, `Host` set, serialization that refuses injection).
"""

from __future__ import annotations

import pytest
from test_request import head_of, req, resp

from egress.proxy.codec.http1 import (
    BodyFraming,
    ResponseHead,
    parse_response_head,
)
from egress.proxy.codec.rewrite import (
    forward_headers,
    forward_response_headers,
    serialize_request_head,
    serialize_response_head,
)

# ---------------------------------------------------------------------------- forwarding


def test_forward_headers_removes_hop_by_hop_and_sets_host() -> None:
    head = head_of(
        req(
            "Host: evil.example",
            "User-Agent: t",
            "Connection: keep-alive, X-Drop, te",
            "Keep-Alive: timeout=5",
            "Proxy-Authorization: Basic c2VjcmV0",
            "Proxy-Connection: keep-alive",
            "TE: trailers",
            "Trailer: X-T",
            "Upgrade: websocket",
            "Proxy-Authenticate: x",
            "x-drop: 1",
            "Accept: */*",
        )
    )
    assert forward_headers(head, "example.com") == [
        ("Host", "example.com"),
        ("User-Agent", "t"),
        ("Accept", "*/*"),
    ]


def test_forward_headers_adds_missing_host_first() -> None:
    head = head_of(req("Accept: */*", "PROXY-CONNECTION: close"))
    assert forward_headers(head, "a.example:8080") == [
        ("Host", "a.example:8080"),
        ("Accept", "*/*"),
    ]


def test_connection_cannot_strip_framing_or_host() -> None:
    """`Connection: content-length` must not make us drop the field that frames the body."""
    head = head_of(
        req(
            "Host: a",
            "Content-Length: 3",
            "Connection: Content-Length, Host, Transfer-Encoding",
            start=b"POST http://a/ HTTP/1.1",
        )
    )
    assert forward_headers(head, "a") == [("Host", "a"), ("Content-Length", "3")]
    chunked = head_of(
        req("Transfer-Encoding: chunked", "Connection: transfer-encoding", start=b"POST h HTTP/1.1")
    )
    assert ("Transfer-Encoding", "chunked") in forward_headers(chunked, "h")


def test_forward_response_headers() -> None:
    result = parse_response_head(
        resp(
            "Content-Length: 2",
            "Connection: keep-alive, X-Hop, content-length",
            "Keep-Alive: timeout=5",
            "Proxy-Authenticate: Basic",
            "X-Hop: 1",
            "Upgrade: h2c",
            "Set-Cookie: a=b",
        ),
        request_method="GET",
    )
    assert result is not None
    assert forward_response_headers(result[0]) == [("Content-Length", "2"), ("Set-Cookie", "a=b")]


def test_serialize_round_trips() -> None:
    raw = req(
        "Host: x", "Content-Length: 2", "X-A: caf\xe9", start=b"PUT http://a.example/p HTTP/1.1"
    )
    head = head_of(raw)
    out = serialize_request_head(head.method, head.target, forward_headers(head, "a.example"))
    assert out == (
        b"PUT http://a.example/p HTTP/1.1\r\nHost: a.example\r\nContent-Length: 2\r\n"
        b"X-A: caf\xe9\r\n\r\n"
    )
    again = head_of(out)
    assert again.headers == (("Host", "a.example"), ("Content-Length", "2"), ("X-A", "café"))
    assert serialize_request_head("GET", "/", [], version="HTTP/1.0") == b"GET / HTTP/1.0\r\n\r\n"


def test_serialize_response_round_trips() -> None:
    out = serialize_response_head(404, "Not Found", [("Content-Length", "0")])
    assert out == b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
    result = parse_response_head(out, request_method="GET")
    assert result is not None
    head: ResponseHead = result[0]
    assert (head.status, head.reason, head.framing) == (404, "Not Found", BodyFraming("length", 0))


@pytest.mark.parametrize(
    "headers",
    [[("X", "a\r\nEvil: 1")], [("X\r\nEvil", "1")], [("X", "a\nb")], [("X", "a\x00")]],
    ids=["crlf_in_value", "crlf_in_name", "lf_in_value", "nul_in_value"],
)
def test_serialize_refuses_injection(headers: list[tuple[str, str]]) -> None:
    with pytest.raises(ValueError, match="CR, LF or NUL"):
        serialize_request_head("GET", "/", headers)


def test_serialize_refuses_injection_in_start_line() -> None:
    with pytest.raises(ValueError, match="CR, LF or NUL"):
        serialize_request_head("GET", "/ HTTP/1.1\r\nEvil: 1\r\nX:", [])

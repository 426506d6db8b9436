"""The byte-for-byte fast paths must agree with the rewriting paths, or step aside."""

import pytest

from egress.proxy.codec import http1 as wire
from egress.proxy.codec import rewrite

GOOD = b"GET http://a.test/x HTTP/1.1\r\nHost: a.test\r\nAccept: */*\r\nX-Y: z\r\n\r\n"


def parse(raw: bytes) -> wire.RequestHead:
    parsed = wire.parse_request_head(raw)
    assert parsed is not None
    return parsed[0]


def test_request_passthrough_equals_rewrite() -> None:
    head = parse(GOOD)
    fast = rewrite.passthrough_request_head(head, GOOD, "/x", "a.test")
    slow = rewrite.serialize_request_head("GET", "/x", rewrite.forward_headers(head, "a.test"))
    assert fast == slow == b"GET /x HTTP/1.1\r\nHost: a.test\r\nAccept: */*\r\nX-Y: z\r\n\r\n"


def test_request_passthrough_after_leading_empty_lines() -> None:
    raw = b"\r\n" + GOOD
    assert rewrite.passthrough_request_head(parse(raw), raw, "/x", "a.test") == (
        b"GET /x HTTP/1.1\r\nHost: a.test\r\nAccept: */*\r\nX-Y: z\r\n\r\n"
    )


@pytest.mark.parametrize(
    ("raw", "host"),
    [
        (GOOD, "b.test"),  # the client's Host disagrees with the judged target
        (GOOD.replace(b"Host: a.test\r\n", b""), "a.test"),  # no Host at all
        (GOOD.replace(b"X-Y: z", b"Connection: x-y"), "a.test"),
        (GOOD.replace(b"X-Y: z", b"Proxy-Authorization: Basic eDp5"), "a.test"),
        (GOOD.replace(b"X-Y: z", b"keep-alive: 5"), "a.test"),
        (GOOD.replace(b"X-Y: z", b"Upgrade: h2c"), "a.test"),
        (GOOD.replace(b"X-Y: z", b"TE: trailers"), "a.test"),
    ],
    ids=["host-mismatch", "no-host", "connection", "proxy-auth", "keep-alive", "upgrade", "te"],
)
def test_request_passthrough_steps_aside(raw: bytes, host: str) -> None:
    assert rewrite.passthrough_request_head(parse(raw), raw, "/x", host) is None


RESP = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n"


def test_response_passthrough() -> None:
    parsed = wire.parse_response_head(RESP, request_method="GET")
    assert parsed is not None
    assert rewrite.passthrough_response_head(parsed[0], RESP) == RESP


@pytest.mark.parametrize(
    "raw",
    [
        RESP.replace(b"HTTP/1.1", b"HTTP/1.0"),
        RESP.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"),
        RESP.replace(b"\r\n\r\n", b"\r\nProxy-Authenticate: Basic\r\n\r\n"),
    ],
    ids=["http10", "connection", "proxy-authenticate"],
)
def test_response_passthrough_steps_aside(raw: bytes) -> None:
    parsed = wire.parse_response_head(raw, request_method="GET")
    assert parsed is not None
    assert rewrite.passthrough_response_head(parsed[0], raw) is None

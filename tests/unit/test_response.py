"""Tests for egress.proxy.codec.response: response heads parsed (1xx, framing by the
request's method) and refused with 502, whole, byte by byte, and under hypothesis.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_request import http_like, resp

from egress.errors import ProtocolError
from egress.proxy.codec.http1 import (
    BodyFraming,
    parse_response_head,
)

# ---------------------------------------------------------------------------- response heads

RESPONSE_OK: list[tuple[str, bytes, str, dict[str, Any]]] = [
    (
        "content_length",
        resp("Content-Length: 12", "Content-Type: text/plain"),
        "GET",
        dict(status=200, reason="OK", keep_alive=True, framing=BodyFraming("length", 12)),
    ),
    ("chunked", resp("Transfer-Encoding: chunked"), "GET", dict(framing=BodyFraming("chunked"))),
    (
        "gzip_then_chunked",
        resp("Transfer-Encoding: gzip, chunked"),
        "GET",
        dict(framing=BodyFraming("chunked")),
    ),
    (
        "te_split_over_two_fields",
        resp("Transfer-Encoding: gzip", "Transfer-Encoding: chunked"),
        "GET",
        dict(framing=BodyFraming("chunked")),
    ),
    (
        "te_not_chunked_reads_to_close",
        resp("Transfer-Encoding: gzip"),
        "GET",
        dict(framing=BodyFraming("close"), keep_alive=False),
    ),
    (
        "no_framing_reads_to_close",
        resp("Content-Type: text/html"),
        "GET",
        dict(framing=BodyFraming("close"), keep_alive=False),
    ),
    (
        "head_request_ignores_length",
        resp("Content-Length: 1000"),
        "HEAD",
        dict(framing=BodyFraming("none"), keep_alive=True),
    ),
    (
        "head_request_no_framing_stays_alive",
        resp(),
        "HEAD",
        dict(framing=BodyFraming("none"), keep_alive=True),
    ),
    (
        "no_content_204",
        resp(start=b"HTTP/1.1 204 No Content"),
        "DELETE",
        dict(status=204, framing=BodyFraming("none"), keep_alive=True),
    ),
    (
        "not_modified_304_with_length",
        resp("Content-Length: 50", start=b"HTTP/1.1 304 Not Modified"),
        "GET",
        dict(status=304, framing=BodyFraming("none"), keep_alive=True),
    ),
    (
        "informational_100",
        resp(start=b"HTTP/1.1 100 Continue"),
        "POST",
        dict(status=100, framing=BodyFraming("none"), keep_alive=True),
    ),
    (
        "early_hints_103",
        resp("Link: </s.css>; rel=preload", start=b"HTTP/1.1 103 Early Hints"),
        "GET",
        dict(status=103, framing=BodyFraming("none")),
    ),
    (
        "switching_protocols_101",
        resp("Upgrade: websocket", "Connection: upgrade", start=b"HTTP/1.1 101 Switching"),
        "GET",
        dict(status=101, framing=BodyFraming("none"), keep_alive=False),
    ),
    (
        "connect_2xx_is_a_tunnel",
        resp(),
        "CONNECT",
        dict(framing=BodyFraming("none"), keep_alive=False),
    ),
    (
        "connect_407_has_a_body",
        resp("Content-Length: 3", start=b"HTTP/1.1 407 Proxy Authentication Required"),
        "CONNECT",
        dict(framing=BodyFraming("length", 3), keep_alive=True),
    ),
    (
        "http10_default_close",
        resp("Content-Length: 1", start=b"HTTP/1.0 200 OK"),
        "GET",
        dict(version="HTTP/1.0", keep_alive=False),
    ),
    (
        "http10_keep_alive",
        resp("Content-Length: 1", "Connection: keep-alive", start=b"HTTP/1.0 200 OK"),
        "GET",
        dict(keep_alive=True),
    ),
    (
        "http11_close",
        resp("Content-Length: 1", "Connection: close"),
        "GET",
        dict(keep_alive=False, framing=BodyFraming("length", 1)),
    ),
    ("empty_reason", resp("Content-Length: 0", start=b"HTTP/1.1 200 "), "GET", dict(reason="")),
    ("missing_reason", resp("Content-Length: 0", start=b"HTTP/1.1 200"), "GET", dict(reason="")),
    (
        "reason_with_spaces_and_tab",
        resp("Content-Length: 0", start=b"HTTP/1.1 404 Not \tFound here"),
        "GET",
        dict(status=404, reason="Not \tFound here"),
    ),
    (
        "reason_obs_text",
        resp("Content-Length: 0", start=b"HTTP/1.1 200 D\xe9j\xe0 vu"),
        "GET",
        dict(reason="Déjà vu"),
    ),
    ("status_999", resp("Content-Length: 0", start=b"HTTP/1.1 999 X"), "GET", dict(status=999)),
]


@pytest.mark.parametrize(
    ("raw", "method", "expected"),
    [(r, m, e) for _, r, m, e in RESPONSE_OK],
    ids=[i for i, _, _, _ in RESPONSE_OK],
)
def test_response_head_ok(raw: bytes, method: str, expected: dict[str, Any]) -> None:
    result = parse_response_head(raw, request_method=method)
    assert result is not None
    head, consumed = result
    assert consumed == len(raw)
    for name, value in expected.items():
        assert getattr(head, name) == value, name
    for i in range(len(raw)):
        assert parse_response_head(raw[:i], request_method=method) is None, i
        assert parse_response_head(raw[:i], request_method=method, searched=i - 1) is None
    assert parse_response_head(raw, request_method=method, searched=len(raw) - 1) == result
    assert parse_response_head(bytearray(raw + b"body"), request_method=method) == result
    assert parse_response_head(memoryview(raw + b"\r\n"), request_method=method) == result


def test_informational_responses_loop_until_the_final_one() -> None:
    buf = (
        resp(start=b"HTTP/1.1 100 Continue")
        + resp("Link: <a>", start=b"HTTP/1.1 103 Early Hints")
        + resp("Content-Length: 2")
        + b"ok"
    )
    statuses = []
    while True:
        result = parse_response_head(buf, request_method="POST")
        assert result is not None
        head, consumed = result
        statuses.append(head.status)
        buf = buf[consumed:]
        if head.status >= 200:
            break
    assert statuses == [100, 103, 200]
    assert buf == b"ok"


RESPONSE_BAD: list[tuple[str, bytes]] = [
    ("cl_and_te", resp("Content-Length: 5", "Transfer-Encoding: chunked")),
    ("te_in_http10", resp("Transfer-Encoding: chunked", start=b"HTTP/1.0 200 OK")),
    ("chunked_not_last", resp("Transfer-Encoding: chunked, gzip")),
    ("chunked_twice", resp("Transfer-Encoding: chunked, chunked")),
    ("te_empty_element", resp("Transfer-Encoding: gzip,,chunked")),
    ("cl_differing", resp("Content-Length: 5", "Content-Length: 6")),
    ("cl_list", resp("Content-Length: 5, 5")),
    ("cl_not_a_number", resp("Content-Length: five")),
    ("status_two_digits", resp(start=b"HTTP/1.1 20 OK")),
    ("status_four_digits", resp(start=b"HTTP/1.1 2000 OK")),
    ("status_below_100", resp(start=b"HTTP/1.1 099 X")),
    ("status_letters", resp(start=b"HTTP/1.1 2x0 OK")),
    ("status_missing", resp(start=b"HTTP/1.1")),
    ("status_double_space", resp(start=b"HTTP/1.1  200 OK")),
    ("version_http2", resp(start=b"HTTP/2 200 OK")),
    ("version_garbage", resp(start=b"ICY 200 OK")),
    ("reason_ctrl", resp(start=b"HTTP/1.1 200 O\x01K")),
    ("reason_bare_cr", resp(start=b"HTTP/1.1 200 O\rK")),
    ("obs_fold", resp("Content-Length: 1", " 2")),
    ("space_before_colon", resp("Content-Length : 1")),
    ("nul_in_value", resp(b"Set-Cookie: a=\x00")),
    ("bare_lf", b"HTTP/1.1 200 OK\nContent-Length: 0\r\n\r\n"),
    ("too_many_headers", resp(*["X: y"] * 257)),
    ("head_too_large", b"HTTP/1.1 200 OK\r\nX: " + b"a" * 65536),
]


@pytest.mark.parametrize("raw", [r for _, r in RESPONSE_BAD], ids=[i for i, _ in RESPONSE_BAD])
def test_response_head_refused_with_502(raw: bytes) -> None:
    with pytest.raises(ProtocolError) as err:
        parse_response_head(raw, request_method="GET")
    assert err.value.status == 502


def test_response_limits_are_configurable() -> None:
    with pytest.raises(ProtocolError):
        parse_response_head(resp(*["X: y"] * 3), request_method="GET", max_headers=2)
    with pytest.raises(ProtocolError):
        parse_response_head(b"HTTP/1.1 200 OK\r\n", request_method="GET", max_size=10)


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(http_like, st.sampled_from(["GET", "HEAD", "CONNECT", "POST"]))
def test_response_parser_returns_or_raises_protocol_error(data: bytes, method: str) -> None:
    try:
        result = parse_response_head(data, request_method=method)
    except ProtocolError as err:
        error: ProtocolError | None = err
    else:
        error = None
    if error is not None:
        assert error.status == 502
        return
    if result is not None:
        assert 0 < result[1] <= len(data)

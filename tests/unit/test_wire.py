"""Tests for egress.proxy.codec.http1: heads, framing, forwarding, and the chunked scanner.

Parsers are fed whole, byte by byte (every prefix) and with trailing bytes, as in h11's
tests/test_io.py; hypothesis checks the invariant "a result, None, or ProtocolError".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from egress.errors import ProtocolError
from egress.proxy.codec.chunked import ChunkedScanner
from egress.proxy.codec.http1 import (
    MAX_REQUEST_HEAD_SIZE,
    BodyFraming,
    RequestHead,
    ResponseHead,
    parse_request_head,
    parse_response_head,
)
from egress.proxy.codec.rewrite import (
    forward_headers,
    forward_response_headers,
    serialize_request_head,
    serialize_response_head,
)

PIPELINED = b"GET http://next.example/ HTTP/1.1\r\nHost: next.example\r\n\r\n"


def req(*lines: str | bytes, start: bytes = b"GET http://example.com/ HTTP/1.1") -> bytes:
    """A request head: the start line, `lines`, and the blank line."""
    encoded = [x.encode("latin-1") if isinstance(x, str) else x for x in lines]
    return b"\r\n".join([start, *encoded]) + b"\r\n\r\n"


def resp(*lines: str | bytes, start: bytes = b"HTTP/1.1 200 OK") -> bytes:
    return req(*lines, start=start)


# ---------------------------------------------------------------------------- request heads

REQUEST_OK: list[tuple[str, bytes, dict[str, Any]]] = [
    (
        "get_absolute_form",
        req("Host: example.com", "Accept: */*"),
        dict(
            method="GET",
            target="http://example.com/",
            version="HTTP/1.1",
            headers=(("Host", "example.com"), ("Accept", "*/*")),
            keep_alive=True,
            framing=BodyFraming("none"),
        ),
    ),
    (
        "get_with_query_and_port",
        req("Host: a.example:8080", start=b"GET http://a.example:8080/p?q=1&r=%20 HTTP/1.1"),
        dict(target="http://a.example:8080/p?q=1&r=%20", framing=BodyFraming("none")),
    ),
    (
        "connect_authority_form",
        req("Host: example.com:443", start=b"CONNECT example.com:443 HTTP/1.1"),
        dict(method="CONNECT", target="example.com:443", keep_alive=True),
    ),
    (
        "connect_ipv6",
        req(start=b"CONNECT [2001:db8::1]:443 HTTP/1.1"),
        dict(method="CONNECT", target="[2001:db8::1]:443", headers=()),
    ),
    (
        "post_content_length",
        req("Host: a", "Content-Length: 5", start=b"POST http://a/ HTTP/1.1"),
        dict(method="POST", framing=BodyFraming("length", 5)),
    ),
    (
        "post_content_length_zero",
        req("Content-Length: 0", start=b"POST http://a/ HTTP/1.1"),
        dict(framing=BodyFraming("length", 0)),
    ),
    (
        "content_length_18_digits",
        req("Content-Length: 999999999999999999", start=b"POST http://a/ HTTP/1.1"),
        dict(framing=BodyFraming("length", 999_999_999_999_999_999)),
    ),
    (
        "post_chunked",
        req("Host: a", "Transfer-Encoding: chunked", start=b"POST http://a/ HTTP/1.1"),
        dict(framing=BodyFraming("chunked")),
    ),
    (
        "chunked_any_case_and_ows",
        req("transfer-encoding: \t CHUNKED \t", start=b"POST http://a/ HTTP/1.1"),
        dict(framing=BodyFraming("chunked"), headers=(("transfer-encoding", "CHUNKED"),)),
    ),
    (
        "http10_default_close",
        req("Host: a", start=b"GET http://a/ HTTP/1.0"),
        dict(version="HTTP/1.0", keep_alive=False),
    ),
    (
        "http10_keep_alive",
        req("Connection: Keep-Alive", start=b"GET http://a/ HTTP/1.0"),
        dict(version="HTTP/1.0", keep_alive=True),
    ),
    (
        "http10_keep_alive_and_close",
        req("Connection: keep-alive, close", start=b"GET http://a/ HTTP/1.0"),
        dict(keep_alive=False),
    ),
    ("http11_close", req("Connection: close"), dict(keep_alive=False)),
    ("http11_close_in_list", req("Connection: foo,, CLOSE ,"), dict(keep_alive=False)),
    (
        "http11_close_second_header",
        req("Connection: x", "connection: close"),
        dict(keep_alive=False),
    ),
    (
        "ows_stripped_inner_kept",
        req("X-A:   a \t b  ", "X-B:", "X-C:\t"),
        dict(headers=(("X-A", "a \t b"), ("X-B", ""), ("X-C", ""))),
    ),
    (
        "obs_text_value_latin1",
        req(b"X-A: caf\xe9 \xff"),
        dict(headers=(("X-A", "café ÿ"),)),
    ),
    ("colon_in_value", req("X-A: b:c: d"), dict(headers=(("X-A", "b:c: d"),))),
    ("lowercase_method_is_a_token", req(start=b"get http://a/ HTTP/1.1"), dict(method="get")),
    ("unusual_method_token", req(start=b"M-SEARCH* http://a/ HTTP/1.1"), dict(method="M-SEARCH*")),
    ("no_headers", req(), dict(headers=(), framing=BodyFraming("none"))),
]


@pytest.mark.parametrize(
    ("raw", "expected"), [(r, e) for _, r, e in REQUEST_OK], ids=[i for i, _, _ in REQUEST_OK]
)
def test_request_head_ok(raw: bytes, expected: dict[str, Any]) -> None:
    result = parse_request_head(raw)
    assert result is not None
    head, consumed = result
    assert consumed == len(raw)
    for name, value in expected.items():
        assert getattr(head, name) == value, name


@pytest.mark.parametrize("raw", [r for _, r, _ in REQUEST_OK], ids=[i for i, _, _ in REQUEST_OK])
def test_request_head_every_prefix_incomplete(raw: bytes) -> None:
    whole = parse_request_head(raw)
    for i in range(len(raw)):
        assert parse_request_head(raw[:i]) is None, i
    # trailing bytes (a body, a pipelined request) are left alone; any buffer type works
    for buf in (raw + PIPELINED, bytearray(raw + b"xyz"), memoryview(raw + b"\0\r\n")):
        assert parse_request_head(buf) == whole


def test_pipelined_requests_are_parsed_one_after_the_other() -> None:
    first = req("Host: a", "Content-Length: 3", start=b"POST http://a/ HTTP/1.1")
    buf = first + b"abc" + PIPELINED
    result = parse_request_head(buf)
    assert result is not None
    head, consumed = result
    assert head.framing == BodyFraming("length", 3)
    rest = buf[consumed + head.framing.length :]
    second = parse_request_head(rest)
    assert second is not None
    assert second[0].target == "http://next.example/"
    assert second[1] == len(rest)


@pytest.mark.parametrize(
    ("prefix", "skipped"), [(b"\r\n", 2), (b"\r\n\r\n", 4)], ids=["one_empty_line", "two"]
)
def test_leading_empty_lines_are_skipped(prefix: bytes, skipped: int) -> None:
    raw = req("Host: a")
    result = parse_request_head(prefix + raw)
    assert result is not None
    assert result[1] == skipped + len(raw)
    assert parse_request_head(prefix) is None


def test_head_exactly_at_the_size_limit() -> None:
    base = req("X-Pad: ")
    raw = req("X-Pad: " + "a" * (MAX_REQUEST_HEAD_SIZE - len(base)))
    assert len(raw) == MAX_REQUEST_HEAD_SIZE
    assert parse_request_head(raw) is not None
    with pytest.raises(ProtocolError) as err:
        parse_request_head(req("X-Pad: " + "a" * (MAX_REQUEST_HEAD_SIZE + 1 - len(base))))
    assert err.value.status == 431


def test_header_count_exactly_at_the_limit() -> None:
    assert parse_request_head(req(*["X: y"] * 100)) is not None
    assert parse_request_head(req(*["X: y"] * 3), max_headers=3) is not None


def test_custom_limits() -> None:
    with pytest.raises(ProtocolError) as err:
        parse_request_head(req(*["X: y"] * 4), max_headers=3)
    assert err.value.status == 431
    with pytest.raises(ProtocolError) as err:
        parse_request_head(b"GET http://a/ HTTP/1.1\r\nHost: a\r\n", max_size=20)
    assert err.value.status == 431


REQUEST_BAD: list[tuple[str, bytes, int]] = [
    # --- framing / smuggling (RFC 9112 6.1-6.3)
    ("cl_and_te", req("Content-Length: 5", "Transfer-Encoding: chunked"), 400),
    ("te_and_cl", req("Transfer-Encoding: chunked", "Content-Length: 5"), 400),
    ("cl_cl_differing", req("Content-Length: 5", "Content-Length: 6"), 400),
    ("cl_cl_identical_refused", req("Content-Length: 5", "Content-Length: 5"), 400),
    ("cl_list_differing", req("Content-Length: 5, 6"), 400),
    ("cl_list_identical_refused", req("Content-Length: 5,5"), 400),
    ("cl_negative", req("Content-Length: -1"), 400),
    ("cl_plus_sign", req("Content-Length: +5"), 400),
    ("cl_hex", req("Content-Length: 0x10"), 400),
    ("cl_inner_space", req("Content-Length: 1 0"), 400),
    ("cl_empty", req("Content-Length:"), 400),
    ("cl_unicode_digit", req(b"Content-Length: \xb2"), 400),
    ("cl_19_digits", req("Content-Length: 1000000000000000000"), 400),
    ("cl_leading_zeros_too_long", req("Content-Length: 0000000000000000001"), 400),
    ("te_chunked_chunked", req("Transfer-Encoding: chunked, chunked"), 400),
    ("te_chunked_twice", req("Transfer-Encoding: chunked", "Transfer-Encoding: chunked"), 400),
    ("te_xchunked", req("Transfer-Encoding: xchunked"), 400),
    ("te_chunked_suffix", req("Transfer-Encoding: chunkedx"), 400),
    ("te_identity", req("Transfer-Encoding: identity"), 400),
    ("te_chunked_identity", req("Transfer-Encoding: chunked, identity"), 400),
    ("te_gzip_chunked_refused", req("Transfer-Encoding: gzip, chunked"), 400),
    (
        "te_gzip_then_chunked_headers",
        req("Transfer-Encoding: gzip", "Transfer-Encoding: chunked"),
        400,
    ),
    ("te_trailing_comma", req("Transfer-Encoding: chunked,"), 400),
    ("te_empty", req("Transfer-Encoding:"), 400),
    ("te_quoted", req('Transfer-Encoding: "chunked"'), 400),
    ("te_in_http10", req("Transfer-Encoding: chunked", start=b"POST http://a/ HTTP/1.0"), 400),
    ("cl_underscore", req("Content_Length: 5"), 400),
    ("te_underscore", req("transfer_encoding: chunked", "Content-Length: 3"), 400),
    ("duplicate_host", req("Host: a", "Host: b"), 400),
    ("duplicate_host_any_case", req("Host: a", "HOST: a"), 400),
    # --- field syntax
    ("obs_fold_space", req("X-A: a", " b"), 400),
    ("obs_fold_tab", req("X-A: a", "\tb"), 400),
    ("obs_fold_first_line", req(" X-A: a"), 400),
    ("space_before_colon", req("Host : a"), 400),
    ("tab_before_colon", req("Content-Length\t: 5"), 400),
    ("space_in_name", req("X A: b"), 400),
    ("no_colon", req("X-A b"), 400),
    ("empty_name", req(": b"), 400),
    ("non_token_name", req("X(A): b"), 400),
    ("non_ascii_name", req(b"X\xe9: b"), 400),
    ("nul_in_value", req(b"X-A: a\x00b"), 400),
    ("ctrl_in_value", req(b"X-A: a\x01b"), 400),
    ("del_in_value", req(b"X-A: a\x7fb"), 400),
    ("vertical_tab_in_value", req(b"X-A: a\x0bb"), 400),
    ("bare_cr_in_value", req(b"X-A: a\rb"), 400),
    ("bare_cr_end_of_value", req(b"X-A: a\r"), 400),
    ("bare_lf_in_value", req(b"X-A: a\nb"), 400),
    ("bare_cr_in_name", req(b"X\r-A: b"), 400),
    ("lf_line_ending", b"GET http://a/ HTTP/1.1\nHost: a\r\n\r\n", 400),
    ("lf_only_head", b"GET http://a/ HTTP/1.1\nHost: a\n\n", 400),
    ("crlf_then_lf_blank_line", b"GET http://a/ HTTP/1.1\r\nHost: a\r\n\n", 400),
    # --- request line
    ("bare_cr_in_request_line", req(start=b"GET http://a/\rx HTTP/1.1"), 400),
    ("bare_cr_before_version", req(start=b"GET http://a/ \rHTTP/1.1"), 400),
    ("bare_cr_end_of_request_line", req(start=b"GET http://a/ HTTP/1.1\r"), 400),
    ("double_space", req(start=b"GET  http://a/ HTTP/1.1"), 400),
    ("leading_space", req(start=b" GET http://a/ HTTP/1.1"), 400),
    ("trailing_space", req(start=b"GET http://a/ HTTP/1.1 "), 400),
    ("tab_separator", req(start=b"GET\thttp://a/ HTTP/1.1"), 400),
    ("missing_version", req(start=b"GET http://a/"), 400),
    ("http09_style", req(start=b"GET /"), 400),
    ("space_in_target", req(start=b"GET http://a/b c HTTP/1.1"), 400),
    ("non_ascii_target", req(start=b"GET http://a/\xe9 HTTP/1.1"), 400),
    ("nul_in_target", req(start=b"GET http://a/\x00 HTTP/1.1"), 400),
    ("non_token_method", req(start=b"GE(T http://a/ HTTP/1.1"), 400),
    ("lowercase_version", req(start=b"GET http://a/ http/1.1"), 400),
    ("version_garbage", req(start=b"GET http://a/ HTTP/1.1x"), 400),
    ("version_http2", req(start=b"GET http://a/ HTTP/2.0"), 505),
    ("version_http12", req(start=b"GET http://a/ HTTP/1.2"), 505),
    ("version_http09", req(start=b"GET http://a/ HTTP/0.9"), 505),
    ("empty_request_line", b"\r\n\r\n\r\n\r\n", 400),
    ("three_leading_empty_lines", b"\r\n\r\n\r\n" + req("Host: a"), 400),
    ("garbage", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", 400),
    # --- limits
    ("too_many_headers", req(*["X: y"] * 101), 431),
    ("head_over_16k_incomplete", b"GET http://a/ HTTP/1.1\r\nX: " + b"a" * 16384, 431),
    ("head_over_16k_complete", req("X: " + "a" * 16384), 431),
]


@pytest.mark.parametrize(
    ("raw", "status"), [(r, s) for _, r, s in REQUEST_BAD], ids=[i for i, _, _ in REQUEST_BAD]
)
def test_request_head_refused(raw: bytes, status: int) -> None:
    with pytest.raises(ProtocolError) as err:
        parse_request_head(raw)
    assert err.value.status == status
    with pytest.raises(ProtocolError):
        parse_request_head(raw + PIPELINED)


@pytest.mark.parametrize(
    ("raw", "status"), [(r, s) for _, r, s in REQUEST_BAD], ids=[i for i, _, _ in REQUEST_BAD]
)
def test_request_head_refused_byte_by_byte(raw: bytes, status: int) -> None:
    """Every prefix is incomplete or already refused; a refusal is never later undone."""
    refused_at, error = None, None
    for i in range(1, len(raw) + 1):
        try:
            result = parse_request_head(raw[:i])
        except ProtocolError as err:
            refused_at, error = i, err
            break
        assert result is None, i
    assert refused_at is not None
    assert error is not None
    assert error.status in (status, 400)
    for j in range(refused_at, len(raw) + 1, max(1, len(raw) // 50)):
        with pytest.raises(ProtocolError):
            parse_request_head(raw[:j])


def feed_with_hint(raw: bytes, step: int = 1) -> tuple[str, object]:
    """Grow a buffer `step` bytes at a time, passing `searched` as a careful caller would."""
    buf, searched = bytearray(), 0
    for i in range(0, len(raw), step):
        buf += raw[i : i + step]
        try:
            result = parse_request_head(buf, searched=searched)
        except ProtocolError as err:
            return ("error", err.status)
        if result is not None:
            return ("ok", result)
        searched = len(buf)
    return ("incomplete", None)


def outcome(raw: bytes) -> tuple[str, object]:
    try:
        result = parse_request_head(raw)
    except ProtocolError as err:
        return ("error", err.status)
    return ("incomplete", None) if result is None else ("ok", result)


ALL_REQUESTS = [r for _, r, _ in REQUEST_OK] + [r for _, r, _ in REQUEST_BAD]
ALL_IDS = [i for i, _, _ in REQUEST_OK] + [i for i, _, _ in REQUEST_BAD]


@pytest.mark.parametrize("step", [1, 2, 7])
@pytest.mark.parametrize("raw", ALL_REQUESTS, ids=ALL_IDS)
def test_searched_hint_gives_the_same_outcome(raw: bytes, step: int) -> None:
    expected = outcome(raw)
    got = feed_with_hint(raw, step)
    if expected[0] == "error" and got[0] == "error":
        assert got[1] in (expected[1], 400)  # a bare CR/LF may be refused earlier
    else:
        assert got == expected


def test_searched_hint_makes_a_trickled_head_linear() -> None:
    raw = b"GET http://a/ HTTP/1.1\r\nX: " + b"a" * MAX_REQUEST_HEAD_SIZE
    assert feed_with_hint(raw) == ("error", 431)


def test_wrong_searched_hint_cannot_make_a_bad_head_pass() -> None:
    """A lying hint only delays (None) or changes the verdict; it never yields a head."""
    raw = req("Host: a", "X-A: a\rb", "Y: c")
    assert outcome(raw) == ("error", 400)
    for searched in range(len(raw) + 5):
        verdict = feed_once(raw, searched)
        assert verdict[0] in ("error", "incomplete"), searched
    # a hint past a blank line makes the head look like it has an empty field line
    early = b"GET http://a/ HTTP/1.1\r\n\r\n" + req("Host: b")
    assert feed_once(early, len(early) - 10) == ("error", 400)


def feed_once(raw: bytes, searched: int) -> tuple[str, object]:
    try:
        result = parse_request_head(raw, searched=searched)
    except ProtocolError as err:
        return ("error", err.status)
    return ("incomplete", None) if result is None else ("ok", result)


@pytest.mark.parametrize(
    "raw",
    [b"GET http://a/ HTTP/1.1\n", b"GET http://a/ HTTP/1.1\r\nHost: a\rx", b"\r\n\n"],
    ids=["bare_lf", "bare_cr", "bare_lf_after_empty_line"],
)
def test_incomplete_head_with_bare_cr_or_lf_fails_fast(raw: bytes) -> None:
    with pytest.raises(ProtocolError) as err:
        parse_request_head(raw)
    assert err.value.status == 400


def test_head_helpers() -> None:
    raw = req(
        "Host: a",
        "Connection: Keep-Alive, X-Secret",
        "x-secret: 1",
        "X-Secret: 2",
        "connection: Upgrade",
    )
    result = parse_request_head(raw)
    assert result is not None
    head = result[0]
    assert head.get("HOST") == "a"
    assert head.get("x-secret") == "1"
    assert head.get("missing") is None
    assert head.get_all("X-SECRET") == ["1", "2"]
    assert head.get_all("missing") == []
    assert head.connection_tokens == frozenset({"keep-alive", "x-secret", "upgrade"})


def test_repr_hides_credentials() -> None:
    raw = req(
        "Host: a", "Proxy-Authorization: Basic c2VjcmV0", "authorization: Bearer tok", "Cookie: s=1"
    )
    head = _head(raw)
    text = repr(head)
    assert "c2VjcmV0" not in text
    assert "tok" not in text
    assert "s=1" not in text
    assert text.startswith("RequestHead(method='GET', target='http://example.com/'")
    assert "('Host', 'a')" in text
    assert "headers=(('Host', 'a'), ('Proxy-Authorization', '<redacted>'), " in text
    assert text.endswith("keep_alive=True, framing=BodyFraming(kind='none', length=0))")
    assert head.get("proxy-authorization") == "Basic c2VjcmV0"  # the value itself is intact
    result = parse_response_head(
        resp("Set-Cookie: id=42", "Content-Length: 0"), request_method="GET"
    )
    assert result is not None
    assert "id=42" not in repr(result[0])
    assert "status=200" in repr(result[0])


def test_heads_are_frozen() -> None:
    result = parse_request_head(req("Host: a"))
    assert result is not None
    with pytest.raises(AttributeError):
        result[0].method = "POST"  # type: ignore[misc]


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


# ---------------------------------------------------------------------------- forwarding


def _head(raw: bytes) -> RequestHead:
    result = parse_request_head(raw)
    assert result is not None
    return result[0]


def test_forward_headers_removes_hop_by_hop_and_sets_host() -> None:
    head = _head(
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
    head = _head(req("Accept: */*", "PROXY-CONNECTION: close"))
    assert forward_headers(head, "a.example:8080") == [
        ("Host", "a.example:8080"),
        ("Accept", "*/*"),
    ]


def test_connection_cannot_strip_framing_or_host() -> None:
    """`Connection: content-length` must not make us drop the field that frames the body."""
    head = _head(
        req(
            "Host: a",
            "Content-Length: 3",
            "Connection: Content-Length, Host, Transfer-Encoding",
            start=b"POST http://a/ HTTP/1.1",
        )
    )
    assert forward_headers(head, "a") == [("Host", "a"), ("Content-Length", "3")]
    chunked = _head(
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
    head = _head(raw)
    out = serialize_request_head(head.method, head.target, forward_headers(head, "a.example"))
    assert out == (
        b"PUT http://a.example/p HTTP/1.1\r\nHost: a.example\r\nContent-Length: 2\r\n"
        b"X-A: caf\xe9\r\n\r\n"
    )
    again = _head(out)
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


# ---------------------------------------------------------------------------- chunked bodies


def scan(body: bytes, splits: Callable[[bytes], list[bytes]] | None = None) -> tuple[int, bool]:
    """Feed `body` to a fresh scanner in pieces; return (bytes consumed, done)."""
    scanner = ChunkedScanner()
    consumed = 0
    for piece in splits(body) if splits else [body]:
        n = scanner.feed(piece)
        assert 0 <= n <= len(piece)
        consumed += n
        if scanner.done:
            break
        assert n == len(piece)
    return consumed, scanner.done


def bytewise(body: bytes) -> list[bytes]:
    return [body[i : i + 1] for i in range(len(body))]


SPLITS: dict[str, Callable[[bytes], list[bytes]] | None] = {
    "whole": None,
    "byte_by_byte": bytewise,
    "pairs": lambda b: [b[i : i + 2] for i in range(0, len(b), 2)],
    "with_empty_pieces": lambda b: [x for i in range(len(b)) for x in (b"", b[i : i + 1])],
}

CHUNKED_OK: list[tuple[str, bytes]] = [
    ("last_chunk_only", b"0\r\n\r\n"),
    ("one_chunk", b"5\r\nhello\r\n0\r\n\r\n"),
    ("two_chunks", b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"),
    ("hex_upper_and_lower", b"A\r\n0123456789\r\na\r\n0123456789\r\n0\r\n\r\n"),
    ("leading_zeros", b"0005\r\nhello\r\n000\r\n\r\n"),
    ("sixteen_digits", b"0000000000000001\r\nx\r\n0\r\n\r\n"),
    ("data_contains_crlf", b"4\r\n\r\n\r\n\r\n0\r\n\r\n"),
    ("extension_name", b"5;ext\r\nhello\r\n0\r\n\r\n"),
    ("extension_token_value", b"5;a=b;c=d-e\r\nhello\r\n0;last\r\n\r\n"),
    ("extension_quoted_value", b'5;a="x y;\\"z\\\\"\r\nhello\r\n0\r\n\r\n'),
    ("trailers", b"5\r\nhello\r\n0\r\nX-Checksum: abc\r\nX-B:  \t v \r\n\r\n"),
    ("trailer_empty_value", b"0\r\nX-A:\r\n\r\n"),
    ("binary_data", b"3\r\n\x00\xff\r\r\n0\r\n\r\n"),
]


@pytest.mark.parametrize("split", list(SPLITS.values()), ids=list(SPLITS))
@pytest.mark.parametrize("body", [b for _, b in CHUNKED_OK], ids=[i for i, _ in CHUNKED_OK])
def test_chunked_body_ok(body: bytes, split: Callable[[bytes], list[bytes]] | None) -> None:
    assert scan(body, split) == (len(body), True)
    # whatever follows belongs to the next message and is not consumed
    assert scan(body + PIPELINED, split) == (len(body), True)


def test_chunked_scanner_stops_at_the_end_of_the_body() -> None:
    body = b"3\r\nabc\r\n0\r\n\r\n"
    scanner = ChunkedScanner()
    assert scanner.feed(body[:4]) == 4
    assert not scanner.done
    assert scanner.feed(body[4:] + b"NEXT") == len(body) - 4
    assert scanner.done
    assert scanner.feed(b"more") == 0
    assert scanner.feed(b"") == 0


def test_chunked_scanner_accepts_memoryview_and_bytearray() -> None:
    body = b"3;x=1\r\nabc\r\n0\r\nT: v\r\n\r\n"
    for buf in (memoryview(body + b"zz"), bytearray(body + b"zz")):
        scanner = ChunkedScanner()
        assert scanner.feed(buf) == len(body)
        assert scanner.done


def test_huge_chunk_size_is_streamed() -> None:
    scanner = ChunkedScanner()
    assert scanner.feed(b"FFFFFFFFFFFFFFFF\r\n") == 18
    assert scanner.feed(b"x" * 100_000) == 100_000
    assert not scanner.done


CHUNKED_BAD: list[tuple[str, bytes]] = [
    ("size_0x_prefix", b"0x1\r\nx\r\n0\r\n\r\n"),
    ("size_negative", b"-1\r\nx\r\n0\r\n\r\n"),
    ("size_plus", b"+1\r\nx\r\n0\r\n\r\n"),
    ("size_leading_space", b" 1\r\nx\r\n0\r\n\r\n"),
    ("size_trailing_space", b"1 \r\nx\r\n0\r\n\r\n"),
    ("size_trailing_tab", b"1\t\r\nx\r\n0\r\n\r\n"),
    ("space_before_extension", b"1 ;a\r\nx\r\n0\r\n\r\n"),
    ("size_17_digits", b"00000000000000001\r\nx\r\n0\r\n\r\n"),
    ("size_empty", b"\r\nx\r\n0\r\n\r\n"),
    ("size_not_hex", b"g\r\nx\r\n0\r\n\r\n"),
    ("size_underscore", b"1_0\r\n"),
    ("size_bare_lf", b"1\nx\r\n0\r\n\r\n"),
    ("size_bare_cr", b"1\rx\r\n0\r\n\r\n"),
    ("size_bare_cr_in_extension", b"1;a\rb\r\nx\r\n0\r\n\r\n"),
    ("extension_empty_name", b"1;\r\nx\r\n0\r\n\r\n"),
    ("extension_empty_value", b"1;a=\r\nx\r\n0\r\n\r\n"),
    ("extension_space_in_value", b"1;a=b c\r\nx\r\n0\r\n\r\n"),
    ("extension_unterminated_quote", b'1;a="b\r\nx\r\n0\r\n\r\n'),
    ("extension_ctrl_in_quote", b'1;a="\x01"\r\nx\r\n0\r\n\r\n'),
    ("extension_too_long", b"1;a=" + b"b" * 4096 + b"\r\nx\r\n0\r\n\r\n"),
    ("data_longer_than_size", b"1\r\nxy\r\n0\r\n\r\n"),
    ("data_shorter_than_size", b"3\r\nxy\r\n0\r\n\r\n"),
    ("data_then_lf", b"1\r\nx\n0\r\n\r\n"),
    ("data_then_cr_only", b"1\r\nx\r0\r\n\r\n"),
    ("data_then_nothing", b"1\r\nx0\r\n\r\n"),
    ("data_then_lf_lf", b"1\r\nx\n\n0\r\n\r\n"),
    ("data_then_lf_cr", b"1\r\nx\n\r0\r\n\r\n"),
    ("data_then_cr_cr", b"1\r\nx\r\r0\r\n\r\n"),
    ("last_chunk_then_lf", b"0\r\n\n"),
    ("last_chunk_bare_lf", b"0\n\r\n"),
    ("trailer_obs_fold", b"0\r\nX: a\r\n b\r\n\r\n"),
    ("trailer_bare_cr", b"0\r\nX: a\rb\r\n\r\n"),
    ("trailer_bare_lf", b"0\r\nX: a\n\r\n"),
    ("trailer_no_colon", b"0\r\nX a\r\n\r\n"),
    ("trailer_space_before_colon", b"0\r\nX : a\r\n\r\n"),
    ("trailer_nul", b"0\r\nX: a\x00\r\n\r\n"),
    ("trailer_too_large", b"0\r\nX: " + b"a" * 8192 + b"\r\n\r\n"),
    ("trailer_too_many_fields", b"0\r\n" + b"X: a\r\n" * 101 + b"\r\n"),
    ("head_smuggled_as_trailer", b"0\r\nGET / HTTP/1.1\r\n\r\n"),
    ("trailer_content_length", b"0\r\nContent-Length: 5\r\n\r\n"),
    ("trailer_transfer_encoding", b"0\r\ntransfer-encoding: chunked\r\n\r\n"),
    ("trailer_host", b"0\r\nHOST: evil.example\r\n\r\n"),
    ("trailer_connection", b"0\r\nConnection: close\r\n\r\n"),
    ("trailer_proxy_authorization", b"0\r\nProxy-Authorization: Basic eA==\r\n\r\n"),
]


@pytest.mark.parametrize("split", list(SPLITS.values()), ids=list(SPLITS))
@pytest.mark.parametrize("body", [b for _, b in CHUNKED_BAD], ids=[i for i, _ in CHUNKED_BAD])
def test_chunked_body_refused(body: bytes, split: Callable[[bytes], list[bytes]] | None) -> None:
    with pytest.raises(ProtocolError) as err:
        scan(body, split)
    assert err.value.status == 400


def test_trailer_limits_are_exact() -> None:
    fields = b"0\r\n" + b"X: a\r\n" * 100 + b"\r\n"
    assert scan(fields) == (len(fields), True)
    pad = 8192 - len(b"X: \r\n\r\n")  # the trailer section (after "0\r\n") is 8 KiB
    big = b"0\r\nX: " + b"a" * pad + b"\r\n\r\n"
    assert len(big) - 3 == 8192
    assert scan(big, bytewise) == (len(big), True)
    line = b"1;" + b"a" * (4096 - 4) + b"\r\nx\r\n0\r\n\r\n"  # a 4 KiB chunk-size line
    assert scan(line) == (len(line), True)


def test_chunked_error_status_is_configurable() -> None:
    with pytest.raises(ProtocolError) as err:
        ChunkedScanner(error_status=502).feed(b"zz\r\n")
    assert err.value.status == 502


def test_chunked_scanner_memory_is_bounded() -> None:
    scanner = ChunkedScanner()
    piece = b"0;" + b"a" * 100
    fed = 0
    while fed + len(piece) < 4096:
        fed += scanner.feed(piece)
        assert len(scanner._line) == fed  # only the unfinished line is kept
    with pytest.raises(ProtocolError, match="too long"):
        scanner.feed(piece)


# ---------------------------------------------------------------------------- properties

HTTP_PIECES = st.sampled_from(
    [
        b"GET ",
        b"POST ",
        b"CONNECT ",
        b"http://a/ ",
        b"a:443 ",
        b"HTTP/1.1",
        b"HTTP/1.0",
        b"HTTP/1.1 200 OK",
        b"HTTP/1.0 204 ",
        b"\r\n",
        b"\r",
        b"\n",
        b" ",
        b"\t",
        b":",
        b"Host: a",
        b"Content-Length: ",
        b"Transfer-Encoding: ",
        b"chunked",
        b"Connection: ",
        b"close",
        b"keep-alive",
        b"5",
        b",",
        b"\x00",
        b"\xff",
        b"X-A: b",
    ]
)
http_like = st.lists(HTTP_PIECES, max_size=30).map(b"".join) | st.binary(max_size=300)


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(http_like)
def test_request_parser_returns_or_raises_protocol_error(data: bytes) -> None:
    try:
        result = parse_request_head(data)
    except ProtocolError as err:
        error: ProtocolError | None = err
    else:
        error = None
    if error is not None:
        assert error.status in (400, 431, 505)
        return
    if result is not None:
        head, consumed = result
        assert 0 < consumed <= len(data)
        assert parse_request_head(data[:consumed]) == result
        assert head.framing.kind in ("none", "length", "chunked")


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(http_like, st.integers(1, 10))
def test_request_parser_searched_hint_is_equivalent(data: bytes, step: int) -> None:
    expected, got = outcome(data), feed_with_hint(data, step)
    if expected[0] == "error" and got[0] == "error":
        assert got[1] in (expected[1], 400)
    else:
        assert got == expected


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


CHUNK_PIECES = st.sampled_from(
    [b"0", b"1", b"a", b"F", b"\r\n", b"\r", b"\n", b";", b"=", b'"', b"x", b" ", b":", b"\t"]
)
chunk_like = st.lists(CHUNK_PIECES, max_size=40).map(b"".join) | st.binary(max_size=200)


@settings(max_examples=500)
@given(chunk_like, st.data())
def test_chunked_scanner_is_split_invariant(data: bytes, draw: st.DataObject) -> None:
    """Any input: consumed bytes or ProtocolError, and the same answer however it is split."""
    cuts = sorted(draw.draw(st.lists(st.integers(0, len(data)), max_size=6)))
    pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]

    def outcome(parts: list[bytes]) -> tuple[str, int, bool]:
        try:
            consumed, done = scan(b"", lambda _: parts)
        except ProtocolError:
            return ("error", 0, False)
        return ("ok", consumed, done)

    whole = outcome([data])
    assert outcome(pieces) == whole
    assert outcome(bytewise(data)) == whole


@st.composite
def chunked_bodies(draw: st.DrawFn) -> bytes:
    out = []
    for chunk in draw(st.lists(st.binary(min_size=1, max_size=40), max_size=6)):
        size = f"{len(chunk):x}".zfill(draw(st.integers(1, 4)))
        size = size.upper() if draw(st.booleans()) else size
        ext = draw(st.sampled_from(["", ";a", ";a=b", ';q="x y"', ";a;b=c"]))
        out.append(f"{size}{ext}\r\n".encode() + chunk + b"\r\n")
    out.append(b"0\r\n")
    for name, value in draw(
        st.lists(
            st.tuples(st.sampled_from(["X-A", "md5"]), st.text(alphabet="abc =;\t", max_size=10)),
            max_size=3,
        )
    ):
        out.append(f"{name}:{value}\r\n".encode())
    out.append(b"\r\n")
    return b"".join(out)


@settings(max_examples=300)
@given(chunked_bodies(), st.binary(max_size=30), st.data())
def test_valid_chunked_body_is_consumed_exactly(
    body: bytes, trailing: bytes, draw: st.DataObject
) -> None:
    data = body + trailing
    cuts = sorted(draw.draw(st.lists(st.integers(0, len(data)), max_size=8)))
    pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    scanner = ChunkedScanner()
    consumed = 0
    for piece in pieces:
        consumed += scanner.feed(piece)
    assert scanner.done
    assert consumed == len(body)
    assert data[consumed:] == trailing

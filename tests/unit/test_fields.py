"""What request and response heads share (egress/proxy/codec/fields.py): a head's end and
field block, its version, keep-alive, `Connection` tokens and `Content-Length`, each refused
with the status the caller passes (400 for a request, 502 for a response; docs/wire.md).
The two parsers built on them are test_request.py and test_response.py."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from egress.errors import ProtocolError
from egress.proxy.codec.fields import (
    MAX_CONTENT_LENGTH_DIGITS,
    content_length_of,
    keep_alive_of,
    parse_fields,
    split_head,
    tokens_of,
    version_of,
)


def test_split_head_finds_the_end_and_the_field_block() -> None:
    data = b"GET / HTTP/1.1\r\nHost: a\r\nX: 1\r\n\r\nbody"
    assert split_head(data, 0, 1024, 10, 400, 0) == (
        b"GET / HTTP/1.1",
        b"\r\nHost: a\r\nX: 1",
        len(data) - len(b"body"),
    )
    assert split_head(data[:20], 0, 1024, 10, 400, 0) is None  # incomplete: more bytes


@pytest.mark.parametrize(("status", "too_big"), [(400, 431), (502, 502)])
def test_a_head_too_large_or_with_too_many_fields(status: int, too_big: int) -> None:
    with pytest.raises(ProtocolError) as err:
        split_head(b"GET / HTTP/1.1\r\n" + b"X: 1\r\n" * 20, 0, 64, 100, status, 0)
    assert err.value.status == too_big
    with pytest.raises(ProtocolError, match="more than 2 header fields") as err:
        split_head(b"GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n", 0, 1024, 2, status, 0)
    assert err.value.status == too_big


def test_a_bare_lf_fails_before_the_head_is_complete() -> None:
    with pytest.raises(ProtocolError, match="bare CR or LF") as err:
        split_head(b"GET / HTTP/1.1\nHost: a", 0, 1024, 10, 400, 0)
    assert err.value.status == 400


@pytest.mark.parametrize(
    ("block", "message"),
    [
        (b"\r\n folded: x", "obs-fold"),
        (b"\r\nHost : a", "whitespace between header name and colon"),
        (b"\r\nno colon", "without a colon"),
        (b"\r\nX: a\x01b", "control character"),
        (b"\r\nX(y): a", "not a token"),
    ],
)
def test_a_bad_field_block_is_named(block: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=message) as err:
        parse_fields(block, 502)
    assert err.value.status == 502


def test_parse_fields_keeps_order_and_watches_framing_fields() -> None:
    headers, special = parse_fields(b"\r\nHost: a\r\nX-A:  b \r\ncontent-length: 3", 400)
    assert headers == (("Host", "a"), ("X-A", "b"), ("content-length", "3"))
    assert special == {"host": ["a"], "content-length": ["3"]}


def test_versions() -> None:
    assert version_of(b"HTTP/1.0", 400) == "HTTP/1.0"
    with pytest.raises(ProtocolError) as err:
        version_of(b"HTTP/2.0", 400)
    assert err.value.status == 505
    with pytest.raises(ProtocolError, match="malformed") as err:
        version_of(b"HTTP/1.1x", 502)
    assert err.value.status == 502


@pytest.mark.parametrize(
    ("version", "connection", "keep"),
    [
        ("HTTP/1.1", None, True),
        ("HTTP/1.1", ["Close"], False),
        ("HTTP/1.1", ["keep-alive, close"], False),
        ("HTTP/1.0", None, False),
        ("HTTP/1.0", ["Keep-Alive"], True),
        ("HTTP/1.0", ["keep-alive", "close"], False),
    ],
)
def test_keep_alive(version: str, connection: list[str] | None, keep: bool) -> None:
    special = {} if connection is None else {"connection": connection}
    assert keep_alive_of(version, special) is keep


# values as `parse_fields` gives them: without the field's own leading and trailing whitespace
VALUES = st.sampled_from(["close", "Keep-Alive", "Upgrade", "", "te ,\ttrailers", ",,"])


@given(st.lists(VALUES, min_size=1))
def test_tokens_are_one_set_however_the_values_are_split(values: list[str]) -> None:
    joined = tokens_of([", ".join(values)])
    assert joined == tokens_of(values)
    assert "" not in joined
    assert all(t == t.strip().lower() for t in joined)


@pytest.mark.parametrize(
    "values",
    [["1", "1"], ["-1"], ["+1"], ["1 "], ["0x10"], ["١"], ["9" * (MAX_CONTENT_LENGTH_DIGITS + 1)]],
)
def test_content_length_is_one_decimal_number(values: list[str]) -> None:
    with pytest.raises(ProtocolError) as err:
        content_length_of(values, 400)
    assert err.value.status == 400


def test_content_length_at_its_digit_limit() -> None:
    assert content_length_of(["9" * MAX_CONTENT_LENGTH_DIGITS], 400) == 10**18 - 1
    assert content_length_of(["007"], 502) == 7

"""Tests for egress.proxy.codec.chunked: the chunked body scanner, fed whole and split,
its limits exact, and split-invariant under hypothesis.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_request import PIPELINED

from egress.errors import ProtocolError
from egress.proxy.codec.chunked import ChunkedScanner

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

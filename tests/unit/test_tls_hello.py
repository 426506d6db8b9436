"""Tests for egress.proxy.codec.tls_hello (the SNI of a ClientHello): real ClientHellos from
Python's ssl module, hand-built malformed ones, every re-split across records and reads, and
the fuzz invariant "None or a result"."""

from __future__ import annotations

import random
import ssl
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from egress.proxy.codec.tls_hello import MAX_HELLO_INPUT, ClientHelloResult, parse_client_hello

from proxykit import client_hello


def handshake_message(records: bytes) -> bytes:
    """The handshake bytes carried by a run of records."""
    out, pos = b"", 0
    while pos < len(records):
        (length,) = struct.unpack("!H", records[pos + 3 : pos + 5])
        out += records[pos + 5 : pos + 5 + length]
        pos += 5 + length
    return out


def records(message: bytes, sizes: list[int], versions: list[int] | None = None) -> bytes:
    """`message` cut into handshake records of the given sizes (the last takes the rest)."""
    out, pos, i = [], 0, 0
    while pos < len(message):
        size = sizes[i] if i < len(sizes) else len(message) - pos
        version = versions[i % len(versions)] if versions else 0x0301
        fragment = message[pos : pos + size]
        out.append(struct.pack("!BHH", 0x16, version, len(fragment)) + fragment)
        pos += size
        i += 1
    return b"".join(out)


def vec(length_bytes: int, data: bytes) -> bytes:
    return len(data).to_bytes(length_bytes, "big") + data


def sni_ext(*names: bytes, name_type: int = 0) -> tuple[int, bytes]:
    entries = b"".join(bytes([name_type]) + vec(2, n) for n in names)
    return 0, vec(2, entries)


def build_hello(
    extensions: list[tuple[int, bytes]] | None = None,
    *,
    version: bytes = b"\x03\x03",
    session_id: bytes = b"\x00" * 32,
    suites: bytes = b"\x13\x01\x13\x02",
    compression: bytes = b"\x00",
    trailing: bytes = b"",
    raw_extensions: bytes | None = None,
    hs_type: int = 1,
) -> bytes:
    """A ClientHello handshake message (header included), fields overridable."""
    body = version + b"\x11" * 32 + vec(1, session_id) + vec(2, suites) + vec(1, compression)
    if raw_extensions is not None:
        body += raw_extensions
    elif extensions is not None:
        body += vec(2, b"".join(struct.pack("!H", t) + vec(2, d) for t, d in extensions))
    body += trailing
    return bytes([hs_type]) + len(body).to_bytes(3, "big") + body


def one_record(message: bytes, version: int = 0x0301) -> bytes:
    return struct.pack("!BHH", 0x16, version, len(message)) + message


TLS = "tls"


# ---------------------------------------------------------------------------- real hellos

REAL: list[tuple[str, str | None, dict[str, object], str | None]] = [
    ("hostname", "example.com", {}, "example.com"),
    ("mixed_case", "API.Example.COM", {}, "api.example.com"),
    ("trailing_dot", "example.com.", {}, "example.com"),
    ("idna", "bücher.example", {}, "xn--bcher-kva.example"),
    ("underscore", "_svc.a-b.example", {}, "_svc.a-b.example"),
    ("long_name", ".".join(["a" * 63] * 3) + ".bb", {}, ".".join(["a" * 63] * 3) + ".bb"),
    ("no_server_hostname", None, {}, None),
    ("ipv4_literal_sends_no_sni", "127.0.0.1", {}, None),
    ("ipv6_literal_sends_no_sni", "2001:db8::1", {}, None),
    (
        "tls12_only",
        "old.example",
        {"maximum_version": ssl.TLSVersion.TLSv1_2},
        "old.example",
    ),
    ("tls13_only", "new.example", {"minimum_version": ssl.TLSVersion.TLSv1_3}, "new.example"),
]


@pytest.mark.parametrize(
    ("name", "options", "sni"), [r[1:] for r in REAL], ids=[r[0] for r in REAL]
)
def test_real_client_hello(name: str | None, options: dict[str, object], sni: str | None) -> None:
    hello = client_hello(name, **options)
    assert parse_client_hello(hello) == ClientHelloResult(TLS, sni)
    assert parse_client_hello(bytearray(hello)) == ClientHelloResult(TLS, sni)
    assert parse_client_hello(memoryview(hello)) == ClientHelloResult(TLS, sni)


@pytest.mark.parametrize("name", ["example.com", None], ids=["sni", "no_sni"])
def test_every_prefix_needs_more_and_trailing_bytes_are_ignored(name: str | None) -> None:
    hello = client_hello(name)
    expected = ClientHelloResult(TLS, name)
    for i in range(len(hello)):
        assert parse_client_hello(hello[:i]) is None, i
    assert parse_client_hello(hello) == expected
    # a client may send its ChangeCipherSpec and early data right behind the hello
    ccs = b"\x14\x03\x03\x00\x01\x01"
    assert parse_client_hello(hello + ccs + b"\x17\x03\x03\x00\x10" + b"x" * 16) == expected
    assert parse_client_hello(hello + b"\x00") == expected


@pytest.mark.parametrize(
    "sizes",
    [[3] * 200, [4], [5, 3, 100], [100, 100, 100], [7] * 80, [511]],
    ids=["3_byte_records", "header_split", "uneven", "100_byte", "7_byte", "511"],
)
def test_client_hello_fragmented_across_records(sizes: list[int]) -> None:
    message = handshake_message(client_hello("fragmented.example"))
    data = records(message, sizes, versions=[0x0301, 0x0302, 0x0303, 0x0304])
    assert parse_client_hello(data) == ClientHelloResult(TLS, "fragmented.example")
    step = 1 if len(data) < 1000 else 7
    for i in range(0, len(data), step):
        assert parse_client_hello(data[:i]) is None, i


def test_record_count_is_bounded() -> None:
    """At most 256 records are read (a DoS bound): one more is `malformed`."""
    message = build_hello([sni_ext(b"a.example"), (21, bytes(300))])
    sizes = [1] * 255
    assert parse_client_hello(records(message, sizes)) == ClientHelloResult(TLS, "a.example")
    one_more = records(message, [*sizes, 1])
    assert parse_client_hello(one_more) == ClientHelloResult("malformed")
    assert parse_client_hello(one_more[: 256 * 6 + 3]) == ClientHelloResult("malformed")


def test_random_resplits_across_records_and_reads() -> None:
    rng = random.Random(1234)
    for name in ["a.example", "z" * 60 + ".example", None]:
        message = handshake_message(client_hello(name))
        for _ in range(30):
            sizes = [rng.randint(1, 300) for _ in range(20)]
            data = records(message, sizes, versions=[rng.randint(0x0301, 0x0304)])
            cut = sorted(rng.sample(range(1, len(data)), 5))
            for c in cut:
                assert parse_client_hello(data[:c]) is None
            assert parse_client_hello(data) == ClientHelloResult(TLS, name)


@pytest.mark.parametrize(
    "first", [b"G", b"GET / HTTP/1.1\r\n", b"\x80", b"\x00", b"\x14\x03\x03", b"\x17\x03\x03"]
)
def test_not_tls_is_decided_from_the_first_byte(first: bytes) -> None:
    assert parse_client_hello(first) == ClientHelloResult("not_tls")
    assert parse_client_hello(first[:1]) == ClientHelloResult("not_tls")


def test_empty_input_needs_more() -> None:
    assert parse_client_hello(b"") is None
    assert parse_client_hello(b"\x16") is None
    assert parse_client_hello(b"\x16\x03\x01\x00") is None


# ---------------------------------------------------------------------------- built hellos

ALPN = (16, vec(2, vec(1, b"h2")))

BUILT_OK: list[tuple[str, bytes, ClientHelloResult]] = [
    ("sni_only", build_hello([sni_ext(b"a.example")]), ClientHelloResult(TLS, "a.example")),
    (
        "sni_after_other_extensions",
        build_hello([ALPN, (43, b"\x02\x03\x04"), sni_ext(b"b.example")]),
        ClientHelloResult(TLS, "b.example"),
    ),
    ("no_extensions_block", build_hello(None), ClientHelloResult(TLS)),
    ("empty_extensions_block", build_hello([]), ClientHelloResult(TLS)),
    ("extensions_without_sni", build_hello([ALPN]), ClientHelloResult(TLS)),
    (
        "ech_outer_name",
        build_hello([sni_ext(b"public.example"), (0xFE0D, b"\x00" * 40)]),
        ClientHelloResult(TLS, "public.example", ech=True),
    ),
    ("ech_without_sni", build_hello([(0xFE0D, b"\x00")]), ClientHelloResult(TLS, None, True)),
    ("uppercase_sni", build_hello([sni_ext(b"A.EXAMPLE.")]), ClientHelloResult(TLS, "a.example")),
    ("empty_session_id", build_hello([sni_ext(b"x")], session_id=b""), ClientHelloResult(TLS, "x")),
    ("tls10_hello", build_hello([sni_ext(b"x")], version=b"\x03\x01"), ClientHelloResult(TLS, "x")),
    ("max_length_name", build_hello([sni_ext(b"a" * 255)]), ClientHelloResult(TLS, "a" * 255)),
]


@pytest.mark.parametrize(
    ("message", "expected"), [b[1:] for b in BUILT_OK], ids=[b[0] for b in BUILT_OK]
)
def test_built_client_hello(message: bytes, expected: ClientHelloResult) -> None:
    assert parse_client_hello(one_record(message)) == expected
    assert parse_client_hello(records(message, [3, 9])) == expected


MALFORMED: list[tuple[str, bytes]] = [
    # --- record layer
    ("record_version_0300", one_record(build_hello([]), version=0x0300)),
    ("record_version_0305", one_record(build_hello([]), version=0x0305)),
    ("record_version_0201", one_record(build_hello([]), version=0x0201)),
    ("record_major_only", b"\x16\x04"),
    ("record_minor_only", b"\x16\x03\x09"),
    ("zero_length_record", b"\x16\x03\x01\x00\x00"),
    ("record_over_16k", b"\x16\x03\x01\x40\x01"),
    (
        "alert_between_fragments",
        records(build_hello([sni_ext(b"a")]), [10])[:15] + b"\x15\x03\x03\x00\x02\x02\x28",
    ),
    (
        "second_record_other_type",
        records(build_hello([sni_ext(b"a")]), [10])[:15] + b"\x17",
    ),
    (
        "record_carries_more_than_the_hello",
        one_record(build_hello([sni_ext(b"a")]) + b"\x01\x00\x00\x00"),
    ),
    (
        "record_announces_more_than_the_hello",
        struct.pack("!BHH", 0x16, 0x0301, 200) + build_hello([sni_ext(b"a")])[:30],
    ),
    ("too_many_records", records(build_hello([sni_ext(b"a"), (21, bytes(300))]), [1] * 400)),
    # --- handshake header
    ("server_hello", one_record(build_hello([], hs_type=2))),
    ("hello_over_64k", b"\x16\x03\x01\x00\x04\x01\x01\x00\x01"),
    # --- ClientHello body
    ("legacy_version_2", one_record(build_hello([], version=b"\x02\x00"))),
    ("session_id_33", one_record(build_hello([], session_id=b"\x00" * 33))),
    ("odd_cipher_suites", one_record(build_hello([], suites=b"\x13\x01\x13"))),
    ("no_cipher_suites", one_record(build_hello([], suites=b""))),
    ("no_compression", one_record(build_hello([], compression=b""))),
    ("truncated_body", one_record(b"\x01\x00\x00\x16\x03\x03" + b"\x11" * 20)),
    ("truncated_random", one_record(b"\x01\x00\x00\x05\x03\x03\x11\x11\x11")),
    ("extensions_length_too_long", one_record(build_hello(None, raw_extensions=b"\x00\x09"))),
    ("one_byte_extensions", one_record(build_hello(None, raw_extensions=b"\x00"))),
    ("bytes_after_extensions", one_record(build_hello([sni_ext(b"a")], trailing=b"\x00"))),
    (
        "truncated_extension",
        one_record(build_hello(None, raw_extensions=vec(2, b"\x00\x00\x00\x09\x00"))),
    ),
    # --- server_name
    ("duplicate_sni_extension", one_record(build_hello([sni_ext(b"a"), sni_ext(b"b")]))),
    ("duplicate_other_extension", one_record(build_hello([ALPN, ALPN, sni_ext(b"a")]))),
    ("two_names", one_record(build_hello([sni_ext(b"allowed.example", b"evil.example")]))),
    ("name_type_1", one_record(build_hello([sni_ext(b"a", name_type=1)]))),
    ("empty_sni_extension", one_record(build_hello([(0, b"")]))),
    ("empty_name_list", one_record(build_hello([(0, vec(2, b""))]))),
    ("empty_name", one_record(build_hello([sni_ext(b"")]))),
    ("only_a_dot", one_record(build_hello([sni_ext(b".")]))),
    ("name_over_255", one_record(build_hello([sni_ext(b"a" * 256)]))),
    ("name_with_space", one_record(build_hello([sni_ext(b"a b")]))),
    ("name_with_slash", one_record(build_hello([sni_ext(b"evil.com/.example.com")]))),
    ("name_with_nul", one_record(build_hello([sni_ext(b"allowed.example\x00.evil")]))),
    ("name_with_percent", one_record(build_hello([sni_ext(b"a%2e")]))),
    ("name_non_ascii", one_record(build_hello([sni_ext("bücher.example".encode())]))),
    ("name_list_length_mismatch", one_record(build_hello([(0, b"\x00\x05\x00\x00\x01a")]))),
    (
        "bytes_after_name_list",
        one_record(build_hello([(0, vec(2, b"\x00" + vec(2, b"a")) + b"!")])),
    ),
]


@pytest.mark.parametrize("data", [m[1] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_client_hello(data: bytes) -> None:
    assert parse_client_hello(data) == ClientHelloResult("malformed")
    # the verdict is final: more bytes do not change it
    assert parse_client_hello(data + b"\x16\x03\x01\x00\x05hello") == ClientHelloResult("malformed")


def padded_hello(body_size: int) -> bytes:
    """A ClientHello whose body is exactly `body_size` bytes (a padding extension)."""
    base = build_hello([sni_ext(b"big.example"), (21, b"")])
    return build_hello([sni_ext(b"big.example"), (21, b"\x00" * (body_size - len(base) + 4))])


def test_largest_hello_is_accepted_and_fits_the_input_bound() -> None:
    message = padded_hello(65536)
    assert len(message) == 4 + 65536
    data = records(message, [16384] * 5)
    assert len(data) <= MAX_HELLO_INPUT
    assert parse_client_hello(data) == ClientHelloResult(TLS, "big.example")
    assert parse_client_hello(data[:-1]) is None
    small_records = records(message, [65540 // 256 + 1] * 256)
    assert len(small_records) <= MAX_HELLO_INPUT
    assert parse_client_hello(small_records) == ClientHelloResult(TLS, "big.example")


def test_hello_over_64k_is_malformed() -> None:
    data = records(padded_hello(65537), [16384] * 5)
    assert parse_client_hello(data[:9]) == ClientHelloResult("malformed")


# ---------------------------------------------------------------------------- properties


@settings(max_examples=1000)
@given(st.binary(max_size=600))
def test_arbitrary_bytes_never_raise(data: bytes) -> None:
    result = parse_client_hello(data)
    assert result is None or isinstance(result, ClientHelloResult)


@settings(max_examples=1000)
@given(st.binary(max_size=400))
def test_arbitrary_record_payload_never_raises(payload: bytes) -> None:
    for prefix in (b"\x16\x03\x01", b"\x16\x03\x03" + struct.pack("!H", len(payload))):
        result = parse_client_hello(prefix + payload)
        assert result is None or isinstance(result, ClientHelloResult)
        if result is not None and result.kind == TLS and result.sni is not None:
            assert result.sni == result.sni.lower().rstrip(".")
            assert result.sni.isascii()


_HELLOS = [client_hello(n) for n in ("mutate.example", None)]


@settings(max_examples=300)
@given(
    st.sampled_from(_HELLOS),
    st.lists(st.tuples(st.integers(0, 600), st.integers(0, 255)), min_size=1, max_size=4),
    st.data(),
)
def test_mutated_real_hellos_never_raise_and_verdicts_are_final(
    hello: bytes, flips: list[tuple[int, int]], data: st.DataObject
) -> None:
    mutated = bytearray(hello)
    for pos, value in flips:
        mutated[pos % len(mutated)] = value
    # Across growing prefixes: None until some verdict, then always that same verdict.
    verdict = None
    cuts = sorted(set(data.draw(st.lists(st.integers(1, len(mutated)), max_size=12))))
    for cut in [*cuts, len(mutated)]:
        result = parse_client_hello(bytes(mutated[:cut]))
        assert result is None or isinstance(result, ClientHelloResult)
        if verdict is not None:
            assert result == verdict
        verdict = result


@settings(max_examples=100)
@given(
    st.from_regex(r"[a-z0-9_-]{1,20}(\.[a-z0-9_-]{1,20}){0,3}", fullmatch=True),
    st.lists(st.integers(1, 400), min_size=1, max_size=10),
    st.integers(0x0301, 0x0304),
)
def test_any_split_gives_the_same_sni(name: str, sizes: list[int], version: int) -> None:
    message = build_hello([ALPN, sni_ext(name.encode()), (43, b"\x02\x03\x04")])
    assert parse_client_hello(records(message, sizes, [version])) == ClientHelloResult(TLS, name)

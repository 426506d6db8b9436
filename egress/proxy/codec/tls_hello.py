"""Sans-I/O extraction of the server name (SNI) from a TLS ClientHello (pure, stdlib only).

Strategy: after a CONNECT the proxy buffers the client's first bytes and calls
`parse_client_hello` on everything received so far, until it returns a result; then it judges
`sni` and relays the buffered bytes unchanged. The function keeps no state and never raises
on any input: it returns None ("need more bytes") or a `ClientHelloResult` whose `kind` is
`tls`, `not_tls` (first byte is not a TLS handshake record) or `malformed`.

It reads TLS records (RFC 8446 5.1) of type handshake, reassembles the handshake message from
as many consecutive records as it spans, and parses the ClientHello (RFC 8446 4.1.2) down to
the server_name extension (RFC 6066 3). Anything a real TLS server would reject, or that two
readers could see differently, is `malformed`: a duplicate extension, more than one name in
server_name, a name type other than host_name, an empty name or a character outside letters,
digits, `-`, `_` and `.`, trailing bytes.

DoS bounds: the handshake message may not announce more than 64 KiB (real ClientHellos are a
few KiB, post-quantum key shares included), and at most 256 records are read (a 64 KiB hello
in records of 256 bytes); past either bound the input is `malformed`. So one call does at most
a few hundred iterations whatever the input, and the caller never needs to buffer more than
`MAX_HELLO_INPUT` bytes (about 66 KiB) before it gets an answer.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Literal

__all__ = ["MAX_HELLO_INPUT", "ClientHelloResult", "parse_client_hello"]

# Limits; see the strategy comment above.
MAX_HANDSHAKE_SIZE = 64 * 1024
MAX_RECORDS = 256
_RECORD_HEADER = 5
_MAX_RECORD_PAYLOAD = 1 << 14  # TLSPlaintext.length MUST NOT exceed 2^14 (RFC 8446 5.1)
# The most input the parser ever needs before it answers (the hello and its record headers).
MAX_HELLO_INPUT = 4 + MAX_HANDSHAKE_SIZE + MAX_RECORDS * _RECORD_HEADER

_HANDSHAKE_RECORD = 0x16
_CLIENT_HELLO = 0x01
_EXT_SERVER_NAME = 0x0000
_EXT_ECH = 0xFE0D  # encrypted_client_hello (draft-ietf-tls-esni): the SNI we see is public
_HOST_NAME = 0x00
_HOSTNAME_BYTES = b"abcdefghijklmnopqrstuvwxyz0123456789-_."  # after lowercasing
_MAX_HOSTNAME = 255  # the DNS limit, with a trailing dot

HelloKind = Literal["tls", "not_tls", "malformed"]


@dataclass(frozen=True, slots=True)
class ClientHelloResult:
    """What the first bytes of a tunnel are.

    `sni` is the host_name of the server_name extension, ASCII, lowercased, without a trailing
    dot, or None (no extension, or kind is not `tls`). `ech` is True when the hello carries an
    encrypted_client_hello extension: then `sni` is only the outer, public name and the real
    destination name is hidden from the proxy.
    """

    kind: HelloKind
    sni: str | None = None
    ech: bool = False


NOT_TLS = ClientHelloResult("not_tls")
MALFORMED = ClientHelloResult("malformed")


class _Malformed(Exception):
    """Internal: the input cannot be a valid ClientHello."""


def parse_client_hello(buf: bytes | bytearray | memoryview) -> ClientHelloResult | None:
    """Classify the first bytes a client sent into a tunnel and extract its SNI.

    Returns None while more bytes are needed to decide, else a `ClientHelloResult`. Decides
    `not_tls` from the first byte alone. Never raises for any input.
    """
    data = bytes(buf[:MAX_HELLO_INPUT])
    if not data:
        return None
    if data[0] != _HANDSHAKE_RECORD:
        return NOT_TLS
    try:
        message = _reassemble(data)
        if message is None:
            return None
        return _parse_hello_body(message)
    except _Malformed:
        return MALFORMED


def _reassemble(data: bytes) -> bytes | None:
    """The ClientHello body (after its 4-byte header) once every record carrying it arrived.

    The records must carry exactly the hello: a ClientHello shares no record with anything
    else, and a record announcing more than the hello still needs is refused at once (so
    the verdict never depends on how the input was split).
    """
    pos = 0
    payload = bytearray()  # handshake bytes so far, the last record's possibly partial
    declared = 0  # sum of the record lengths announced so far
    for _ in range(MAX_RECORDS):
        if len(data) - pos < _RECORD_HEADER:
            _check_record_prefix(data[pos:])
            return None
        length = _record_length(data, pos)
        declared += length
        fragment = data[pos + _RECORD_HEADER : pos + _RECORD_HEADER + length]
        payload += fragment
        pos += _RECORD_HEADER + len(fragment)
        if len(payload) >= 4:
            needed = 4 + _hello_length(payload[:4])
            if declared > needed:
                raise _Malformed
            if len(payload) == needed:
                return bytes(payload[4:])
        if len(fragment) < length:
            return None  # this record is still incomplete
    raise _Malformed


def _check_record_prefix(prefix: bytes) -> None:
    # Reject early what can already be seen of an incomplete record header.
    if prefix[:1] not in (b"", bytes([_HANDSHAKE_RECORD])):
        raise _Malformed
    if len(prefix) >= 2 and prefix[1] != 0x03:
        raise _Malformed
    if len(prefix) >= 3 and not 0x01 <= prefix[2] <= 0x04:
        raise _Malformed


def _record_length(data: bytes, pos: int) -> int:
    # TLSPlaintext: type(1) legacy_record_version(2) length(2); 0x0301..0x0304 are the
    # versions seen in a first flight. Zero-length handshake records are forbidden.
    _check_record_prefix(data[pos : pos + 3])
    length = int.from_bytes(data[pos + 3 : pos + 5], "big")
    if not 0 < length <= _MAX_RECORD_PAYLOAD:
        raise _Malformed
    return length


def _hello_length(header: bytes | bytearray) -> int:
    if header[0] != _CLIENT_HELLO:
        raise _Malformed
    length = int.from_bytes(header[1:4], "big")
    if length > MAX_HANDSHAKE_SIZE:
        raise _Malformed
    return length


class _Reader:
    """Bounds-checked reads from a byte string; any overrun is `_Malformed`."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.data):
            raise _Malformed
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def uint(self, n: int) -> int:
        return int.from_bytes(self.take(n), "big")

    def vector(self, length_bytes: int, minimum: int = 0, maximum: int = 1 << 24) -> _Reader:
        length = self.uint(length_bytes)
        if not minimum <= length <= maximum:
            raise _Malformed
        return _Reader(self.take(length))

    @property
    def left(self) -> int:
        return len(self.data) - self.pos


def _parse_hello_body(body: bytes) -> ClientHelloResult:
    # legacy_version(2) random(32) legacy_session_id<0..32>
    # cipher_suites<2..2^16-2> legacy_compression_methods<1..2^8-1> [extensions<8..2^16-1>]
    r = _Reader(body)
    if r.uint(2) >> 8 != 0x03:
        raise _Malformed
    r.take(32)
    r.vector(1, maximum=32)
    suites = r.vector(2, minimum=2)
    if suites.left % 2:
        raise _Malformed
    r.vector(1, minimum=1)
    if not r.left:
        return ClientHelloResult("tls")  # a pre-extensions hello (SSL 3.0 style)
    extensions = r.vector(2)
    if r.left:
        raise _Malformed
    return _parse_extensions(extensions)


def _parse_extensions(r: _Reader) -> ClientHelloResult:
    # A flat loop over `Extension extensions<...>` (type(2) data<0..2^16-1>): a hello
    # carries a dozen or two, so this is the hot part of the parse.
    data, pos, end = r.data, r.pos, len(r.data)
    seen: set[int] = set()
    sni: str | None = None
    while pos < end:
        if end - pos < 4:
            raise _Malformed
        ext_type, length = _EXT_HEADER.unpack_from(data, pos)
        pos += 4
        if end - pos < length or ext_type in seen:
            raise _Malformed  # overrun, or a duplicate (RFC 8446 4.2: at most one of each)
        seen.add(ext_type)
        if ext_type == _EXT_SERVER_NAME:
            sni = _parse_server_name(_Reader(data[pos : pos + length]))
        pos += length
    return ClientHelloResult("tls", sni, _EXT_ECH in seen)


_EXT_HEADER = struct.Struct("!HH")


def _parse_server_name(ext: _Reader) -> str:
    # ServerNameList server_name_list<1..2^16-1>; ServerName: name_type(1) HostName<1..2^16-1>.
    # We accept exactly one host_name entry (as OpenSSL does): a second name would be a way
    # to show us one name and the server another.
    names = ext.vector(2, minimum=1)
    if ext.left:
        raise _Malformed
    if names.uint(1) != _HOST_NAME:
        raise _Malformed
    raw = names.vector(2, minimum=1, maximum=_MAX_HOSTNAME).data.lower()
    if names.left:
        raise _Malformed
    if raw.translate(None, _HOSTNAME_BYTES):
        raise _Malformed
    if raw.endswith(b"."):
        raw = raw[:-1]
    if not raw:
        raise _Malformed
    return raw.decode("ascii")

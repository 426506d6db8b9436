"""What request and response heads share (pure, stdlib only; docs/wire.md): the limits, the
byte classes, `BodyFraming`, the case-insensitive field access of a parsed head, and the
parsing of the head's frame (its end, its field block, its version, keep-alive and
Content-Length).

`http1.py` is the module the proxy imports; `request.py` and `response.py` hold the
two head parsers built on these pieces.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from egress.errors import ProtocolError

# max_incomplete_event_size is 16 KiB, Apache's LimitRequestFields is 100.
MAX_REQUEST_HEAD_SIZE = 16 * 1024
MAX_REQUEST_HEADERS = 100
# Upstream heads are bigger (Set-Cookie, Content-Security-Policy): 64 KiB is nginx's
# proxy_buffer_size ceiling most deployments stay under; 256 fields is generous.
MAX_RESPONSE_HEAD_SIZE = 64 * 1024
MAX_RESPONSE_HEADERS = 256
# RFC 9112 2.2: a server SHOULD ignore at least one empty line before the request-line
# (some clients send CRLF after a POST body). Two is enough and keeps garbage out.
MAX_LEADING_EMPTY_LINES = 2
# 18 decimal digits stay below 2**63, so a length fits every next hop's signed 64-bit integer.
MAX_CONTENT_LENGTH_DIGITS = 18
# 16 hex digits = 2**64 - 1, the largest chunk any implementation can represent.
MAX_CHUNK_SIZE_DIGITS = 16
# A chunk-size line with its extensions and CRLF (nginx and Node.js use similar bounds).
MAX_CHUNK_LINE = 4 * 1024
# The whole trailer section after the last chunk, including its final CRLF, and its lines.
MAX_TRAILER_SIZE = 8 * 1024
MAX_TRAILER_FIELDS = 100

# Byte classes (RFC 9110 5.6.2 tchar, 5.5 field-vchar/obs-text), used with bytes.translate:
# `x.translate(None, CLASS)` is empty exactly when every byte of x is in CLASS.
TCHAR = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
VCHAR = bytes(range(0x21, 0x7F))
FIELD_TEXT = b"\t " + VCHAR + bytes(range(0x80, 0x100))  # field values, reason phrases
OWS = b" \t"
VERSIONS = {b"HTTP/1.1": "HTTP/1.1", b"HTTP/1.0": "HTTP/1.0"}
OTHER_VERSION = re.compile(rb"HTTP/[0-9]\.[0-9]")

# Hop-by-hop fields (RFC 9110 7.6.1, docs/proxy.md#requests), removed when forwarding.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "upgrade",
    }
)
# Never removed because `Connection` names them: dropping a framing header while framing the
# body by it would desynchronise us from the next hop (smuggling), and Host is ours to set.
NEVER_HOP_BY_HOP = frozenset({"content-length", "transfer-encoding", "host"})

FramingKind = Literal["none", "length", "chunked", "close"]
Fields = tuple[tuple[str, str], ...]  # a head's fields, in order, names as sent


@dataclass(frozen=True, slots=True)
class BodyFraming:
    """How the body after a head is delimited.

    `none`: no body; `length`: exactly `length` bytes; `chunked`: feed the bytes to a
    `ChunkedScanner` until it is done; `close` (responses only): everything until the server
    closes the connection, which therefore cannot be kept alive.
    """

    kind: FramingKind
    length: int = 0


NO_BODY = BodyFraming("none")
CHUNKED = BodyFraming("chunked")
UNTIL_CLOSE = BodyFraming("close")


class FieldBlock:
    """Case-insensitive access to a head's `headers` (shared by request and response).

    `headers` is each subclass's dataclass field and is not annotated here: compiled
    (docs/architecture.md#a-compiled-build), an annotation here becomes a class attribute,
    which the dataclasses below would take for the field's default.
    """

    __slots__ = ()

    def get(self, name: str) -> str | None:
        """The value of the first field called `name` (any case), or None."""
        key = name.lower()
        headers: Fields = self.headers  # type: ignore[attr-defined]
        for n, v in headers:
            if n.lower() == key:
                return v
        return None

    def get_all(self, name: str) -> list[str]:
        """The values of every field called `name` (any case), in order."""
        key = name.lower()
        headers: Fields = self.headers  # type: ignore[attr-defined]
        return [v for n, v in headers if n.lower() == key]

    @property
    def connection_tokens(self) -> frozenset[str]:
        """Lowercased tokens of all `Connection` fields (`close`, `keep-alive`, field names)."""
        return tokens_of(self.get_all("connection"))

    def __repr__(self) -> str:
        # Credentials never reach a log through a repr: tokens are never logged
        # (docs/audit-log.md#redaction).
        parts = []
        for name in self.__dataclass_fields__:  # type: ignore[attr-defined]
            value = getattr(self, name)
            if name == "headers":
                value = tuple((n, "<redacted>" if n.lower() in SECRETS else v) for n, v in value)
            parts.append(f"{name}={value!r}")
        return f"{type(self).__name__}({', '.join(parts)})"


SECRETS = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie"})


def as_bytes(buf: bytes | bytearray | memoryview, max_size: int) -> bytes | bytearray:
    # bytes and bytearray are searched in place; a memoryview has no find(), so copy what
    # can matter (a bounded amount).
    if isinstance(buf, memoryview):
        return buf[: max_size + 1].tobytes()
    return buf


def split_head(
    data: bytes | bytearray,
    start: int,
    max_size: int,
    max_headers: int,
    status: int,
    searched: int,
) -> tuple[bytes, bytes, int] | None:
    """(start line, field block, bytes consumed), or None if the head is incomplete.

    The field block is every field line, each preceded by its CRLF (see `parse_fields`).
    Bytes before `searched` were seen incomplete and valid so far, and are not searched again.
    """
    searched = min(searched, len(data), max_size)
    end = data.find(b"\r\n\r\n", max(start, searched - 3), max_size)
    if end < 0:
        check_partial(data, max(start, searched), max_size, status)
        if len(data) >= max_size:
            raise ProtocolError(f"no complete head within {max_size} bytes", STATUS_431(status))
        return None
    first_end = data.find(b"\r\n", start, end + 2)
    block = bytes(data[first_end:end])
    if block.count(b"\r\n") > max_headers:
        raise ProtocolError(f"more than {max_headers} header fields", STATUS_431(status))
    return bytes(data[start:first_end]), block, end + 4


def check_partial(data: bytes | bytearray, start: int, max_size: int, status: int) -> None:
    # Fail fast on an incomplete head that can never become valid (a bare CR or LF), rather
    # than waiting for more bytes until the size limit or a timeout. A final CR may still be
    # followed by its LF; so when resuming, a CR just before `start` is checked again.
    if start and data[start - 1 : start] == b"\r":
        start -= 1
    part = bytes(data[start:max_size])
    if part.endswith(b"\r"):
        part = part[:-1]
    crlf = part.count(b"\r\n")
    if part.count(b"\r") != crlf or part.count(b"\n") != crlf:
        raise ProtocolError("bare CR or LF in head (lines must end in CRLF)", status)


def STATUS_431(status: int) -> int:
    return 431 if status == 400 else status


def version_of(raw: bytes, status: int) -> str:
    version = VERSIONS.get(raw)
    if version is not None:
        return version
    if OTHER_VERSION.fullmatch(raw):
        raise ProtocolError("HTTP version not supported", 505 if status == 400 else status)
    raise ProtocolError("malformed HTTP version", status)


def parse_fields(
    block: bytes, status: int
) -> tuple[tuple[tuple[str, str], ...], dict[str, list[str]]]:
    """(headers, the values of the fields in `WATCHED` by lowercased name).

    The whole block is validated by one regular expression (each line `token ":"
    field-text`: so no bare CR or LF, no obs-fold, no whitespace before the colon, no control
    character); only a failing block is walked line by line, for the error message.
    """
    if FIELD_BLOCK.fullmatch(block) is None:
        raise ProtocolError(bad_field_block(block), status)
    lines = block.decode("latin-1").split("\r\n")
    headers = []
    special: dict[str, list[str]] = {}
    for i in range(1, len(lines)):
        name, _, value = lines[i].partition(":")
        value = value.strip(" \t")
        headers.append((name, value))
        key = name.lower()
        if key in WATCHED:
            special.setdefault(key, []).append(value)
    return tuple(headers), special


WATCHED = frozenset(
    {"content-length", "transfer-encoding", "connection", "host"}
    | {"content_length", "transfer_encoding"}
)
FIELD_BLOCK = re.compile(rb"(?:\r\n[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[\t\x20-\x7e\x80-\xff]*)*")


def bad_field_block(block: bytes) -> str:
    for line in block.split(b"\r\n")[1:]:
        name, colon, value = line.partition(b":")
        if not name or name.translate(None, TCHAR):
            return bad_field_line(line, colon)
        if value.translate(None, FIELD_TEXT):
            return bad_field_value(value)
    return "malformed header field"


def bad_field_line(line: bytes, colon: bytes) -> str:
    if line[:1] in (b" ", b"\t"):
        return "obs-fold (a header line starting with whitespace) is not accepted"
    if b"\r" in line or b"\n" in line:
        return "bare CR or LF in head (lines must end in CRLF)"
    if not colon:
        return "header line without a colon"
    name = line.partition(b":")[0]
    if name.rstrip(OWS) != name:
        return "whitespace between header name and colon"
    return "header name is not a token"


def bad_field_value(value: bytes) -> str:
    if b"\r" in value or b"\n" in value:
        return "bare CR or LF in head (lines must end in CRLF)"
    return "control character in a header value"


def keep_alive_of(version: str, special: dict[str, list[str]]) -> bool:
    connection = special.get("connection")
    if connection is None:
        return version == "HTTP/1.1"
    tokens = tokens_of(connection)
    if version == "HTTP/1.1":
        return "close" not in tokens
    return "keep-alive" in tokens and "close" not in tokens


def tokens_of(values: list[str]) -> frozenset[str]:
    if len(values) == 1 and "," not in values[0]:  # the usual `Connection: keep-alive`
        return frozenset((values[0].lower(),)) - EMPTY
    return frozenset([t.strip(" \t").lower() for v in values for t in v.split(",")]) - EMPTY


EMPTY = frozenset({""})


def content_length_of(values: list[str], status: int) -> int:
    if len(values) != 1:
        raise ProtocolError("more than one Content-Length header field", status)
    value = values[0]
    if not (value.isascii() and value.isdigit()):
        raise ProtocolError("Content-Length is not a single decimal number", status)
    if len(value) > MAX_CONTENT_LENGTH_DIGITS:
        raise ProtocolError("Content-Length is too long", status)
    return int(value)

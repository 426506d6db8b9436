"""Sans-I/O HTTP/1.1 message heads and body framing for the proxy (pure, stdlib only).

Strategy: the caller owns the socket and a receive buffer. `parse_request_head` and
`parse_response_head` look at that buffer and either return a parsed head plus the number of
bytes it used, return None ("need more bytes"), or raise `ProtocolError` carrying the status
to answer with. They keep no state, so a caller simply calls again once more bytes arrived.
Bodies are never copied or rewritten: `BodyFraming` says how long the body is, and
`ChunkedScanner` (`chunked.py`) validates a chunked body incrementally while the caller
relays the very same bytes, so what we judged is exactly what the next hop receives.

The parsers are deliberately stricter than RFC 9112 allows a recipient to be, because a proxy
that is lenient where the next hop is strict (or the reverse) is how requests get smuggled.
What we refuse, and why, is listed in docs/wire.md. In short: lines end in CRLF (a bare CR or
bare LF is a 400), no obs-fold, no whitespace before the colon, no control characters, exactly
one framing header, and `Transfer-Encoding` on a request must be exactly `chunked`.

DoS bounds: a head is searched only within its size limit (16 KiB for requests, 64 KiB for
responses) and has a bounded number of field lines; the chunk scanner keeps at most one line
(4 KiB for a chunk-size line, 8 KiB of trailer section in all) whatever the body size.
Being stateless, a head parser rescans the buffer on each call: at most `max_size` bytes, in C
(`bytes.find`/`count`), so a client trickling its head byte by byte costs little more than
the head timeout it is subject to anyway.

What is sent onwards (hop-by-hop fields removed, `Host` set, heads serialized or passed
through byte for byte) is `rewrite.py`.

Speed: no per-byte Python loops. One `find` locates the end of the head, one precompiled
regular expression validates the request line and another the whole field block; only then
are lines split, and per field there is just a partition, a strip and a lower.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, NoReturn

from egress.errors import ProtocolError

__all__ = [
    "MAX_REQUEST_HEADERS",
    "MAX_REQUEST_HEAD_SIZE",
    "MAX_RESPONSE_HEADERS",
    "MAX_RESPONSE_HEAD_SIZE",
    "BodyFraming",
    "RequestHead",
    "ResponseHead",
    "parse_request_head",
    "parse_response_head",
]

# Limits. The request defaults are docs/proxy.md#limits (16 KiB, 100 headers): h11's default
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
_TCHAR = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_VCHAR = bytes(range(0x21, 0x7F))
_FIELD_TEXT = b"\t " + _VCHAR + bytes(range(0x80, 0x100))  # field values, reason phrases
_OWS = b" \t"
_VERSIONS = {b"HTTP/1.1": "HTTP/1.1", b"HTTP/1.0": "HTTP/1.0"}
_OTHER_VERSION = re.compile(rb"HTTP/[0-9]\.[0-9]")

# Hop-by-hop fields (RFC 9110 7.6.1, docs/proxy.md#requests), removed when forwarding.
_HOP_BY_HOP = frozenset(
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
_NEVER_HOP_BY_HOP = frozenset({"content-length", "transfer-encoding", "host"})

FramingKind = Literal["none", "length", "chunked", "close"]


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


class _Fields:
    """Case-insensitive access to a head's `headers` (shared by request and response)."""

    __slots__ = ()
    headers: tuple[tuple[str, str], ...]

    def get(self, name: str) -> str | None:
        """The value of the first field called `name` (any case), or None."""
        key = name.lower()
        for n, v in self.headers:
            if n.lower() == key:
                return v
        return None

    def get_all(self, name: str) -> list[str]:
        """The values of every field called `name` (any case), in order."""
        key = name.lower()
        return [v for n, v in self.headers if n.lower() == key]

    @property
    def connection_tokens(self) -> frozenset[str]:
        """Lowercased tokens of all `Connection` fields (`close`, `keep-alive`, field names)."""
        return _tokens(self.get_all("connection"))

    def __repr__(self) -> str:
        # Credentials never reach a log through a repr: tokens are never logged
        # (docs/audit-log.md#redaction).
        parts = []
        for name in self.__dataclass_fields__:  # type: ignore[attr-defined]
            value = getattr(self, name)
            if name == "headers":
                value = tuple((n, "<redacted>" if n.lower() in _SECRETS else v) for n, v in value)
            parts.append(f"{name}={value!r}")
        return f"{type(self).__name__}({', '.join(parts)})"


_SECRETS = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie"})


@dataclass(frozen=True, slots=True, repr=False)
class RequestHead(_Fields):
    """A parsed request head. `target` is exactly as sent; `headers` keep order and case.

    Its repr hides the values of Authorization, Proxy-Authorization, Cookie and Set-Cookie.
    """

    method: str
    target: str
    version: str
    headers: tuple[tuple[str, str], ...]
    keep_alive: bool
    framing: BodyFraming


@dataclass(frozen=True, slots=True, repr=False)
class ResponseHead(_Fields):
    """A parsed response head; `framing` already accounts for the request method.

    Its repr hides credential and cookie values, like `RequestHead`'s.
    """

    version: str
    status: int
    reason: str
    headers: tuple[tuple[str, str], ...]
    keep_alive: bool
    framing: BodyFraming


# ---------------------------------------------------------------------------- heads


def parse_request_head(
    buf: bytes | bytearray | memoryview,
    *,
    max_size: int = MAX_REQUEST_HEAD_SIZE,
    max_headers: int = MAX_REQUEST_HEADERS,
    searched: int = 0,
) -> tuple[RequestHead, int] | None:
    """Parse the request head at the start of `buf`.

    Returns `(head, consumed)` where `consumed` counts the bytes up to and including the blank
    line (and up to two skipped leading empty lines); whatever follows is the body or a
    pipelined request and is left to the caller. Returns None while the head is incomplete.

    `searched` is optional: pass `len(buf)` as it was when the previous call for this same
    head returned None, and only the new bytes are searched (h11's ReceiveBuffer does the
    same); otherwise a client trickling its head byte by byte makes each call rescan up to
    `max_size` bytes. A wrong hint cannot make a bad head pass: it at worst delays or changes
    the error.

    Raises `ProtocolError` with status 400 for a malformed or smuggling-prone head (see
    docs/wire.md), 431 when no complete head fits in `max_size` bytes or it has more than
    `max_headers` fields, and 505 for an HTTP version other than 1.0 and 1.1.
    """
    data = _as_bytes(buf, max_size)
    split = _split_head(data, _skip_empty_lines(data), max_size, max_headers, 400, searched)
    if split is None:
        return None
    first, block, consumed = split
    method, target, version = _parse_request_line(first)
    headers, special = _parse_fields(block, 400)
    if len(special.get("host", ())) > 1:
        raise ProtocolError("more than one Host header field", 400)
    framing = _request_framing(version, special)
    keep_alive = _keep_alive(version, special)
    return RequestHead(method, target, version, headers, keep_alive, framing), consumed


def parse_response_head(
    buf: bytes | bytearray | memoryview,
    *,
    request_method: str,
    max_size: int = MAX_RESPONSE_HEAD_SIZE,
    max_headers: int = MAX_RESPONSE_HEADERS,
    searched: int = 0,
) -> tuple[ResponseHead, int] | None:
    """Parse the response head at the start of `buf`, sent in answer to `request_method`.

    Same contract as `parse_request_head` (including `searched`). The framing follows
    RFC 9112 6.3: a response to HEAD, a 1xx, 204 or 304 has no body; then `Transfer-Encoding`
    whose final coding is `chunked`, then `Content-Length`; otherwise (including a non-chunked
    transfer coding) the body runs until the server closes, and `keep_alive` is False.

    A 1xx other than 101 is informational: relay (or drop) it and parse again, the final
    response follows on the same connection. A 101, or a 2xx to CONNECT, turns the connection
    into something that is not HTTP: framing `none` and `keep_alive` False.

    Raises `ProtocolError` with status 502 (the answer a proxy owes its client for a broken
    upstream) for a malformed head, an over-long head or too many fields.
    """
    data = _as_bytes(buf, max_size)
    split = _split_head(data, 0, max_size, max_headers, 502, searched)
    if split is None:
        return None
    first, block, consumed = split
    version, status, reason = _parse_status_line(first)
    headers, special = _parse_fields(block, 502)
    framing = _response_framing(version, special)
    leaves_http = status == 101 or (request_method == "CONNECT" and 200 <= status < 300)
    if leaves_http or request_method == "HEAD" or status < 200 or status in (204, 304):
        framing = NO_BODY
    keep_alive = _keep_alive(version, special) and framing is not UNTIL_CLOSE and not leaves_http
    return ResponseHead(version, status, reason, headers, keep_alive, framing), consumed


def _as_bytes(buf: bytes | bytearray | memoryview, max_size: int) -> bytes | bytearray:
    # bytes and bytearray are searched in place; a memoryview has no find(), so copy what
    # can matter (a bounded amount).
    if isinstance(buf, memoryview):
        return buf[: max_size + 1].tobytes()
    return buf


def _skip_empty_lines(data: bytes | bytearray) -> int:
    if not data.startswith(b"\r\n"):
        return 0
    start = 0
    for _ in range(MAX_LEADING_EMPTY_LINES):
        if not data.startswith(b"\r\n", start):
            break
        start += 2
    return start


def _split_head(
    data: bytes | bytearray,
    start: int,
    max_size: int,
    max_headers: int,
    status: int,
    searched: int,
) -> tuple[bytes, bytes, int] | None:
    """(start line, field block, bytes consumed), or None if the head is incomplete.

    The field block is every field line, each preceded by its CRLF (see `_parse_fields`).
    Bytes before `searched` were seen incomplete and valid so far, and are not searched again.
    """
    searched = min(searched, len(data), max_size)
    end = data.find(b"\r\n\r\n", max(start, searched - 3), max_size)
    if end < 0:
        _check_partial(data, max(start, searched), max_size, status)
        if len(data) >= max_size:
            raise ProtocolError(f"no complete head within {max_size} bytes", _431(status))
        return None
    first_end = data.find(b"\r\n", start, end + 2)
    block = bytes(data[first_end:end])
    if block.count(b"\r\n") > max_headers:
        raise ProtocolError(f"more than {max_headers} header fields", _431(status))
    return bytes(data[start:first_end]), block, end + 4


def _check_partial(data: bytes | bytearray, start: int, max_size: int, status: int) -> None:
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


def _431(status: int) -> int:
    return 431 if status == 400 else status


def _parse_request_line(line: bytes) -> tuple[str, str, str]:
    if _REQUEST_LINE.fullmatch(line) is not None:
        method, target, version = line.decode("ascii").split(" ")
        return method, target, version
    return _bad_request_line(line)


# request-line = method SP request-target SP HTTP-version (RFC 9112 3): the target is any
# run of visible ASCII (so no CR, LF, HTAB, control or non-ASCII byte).
_REQUEST_LINE = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+ [\x21-\x7e]+ HTTP/1\.[01]")


def _bad_request_line(line: bytes) -> NoReturn:
    if b"\r" in line or b"\n" in line:
        raise ProtocolError("bare CR or LF in head (lines must end in CRLF)", 400)
    parts = line.split(b" ")
    if len(parts) != 3:
        raise ProtocolError("request line is not 'method SP target SP version'", 400)
    method, target, version = parts
    if not method or method.translate(None, _TCHAR):
        raise ProtocolError("request method is not a token", 400)
    if not target or target.translate(None, _VCHAR):
        raise ProtocolError("request target is empty or has a non-visible character", 400)
    _version(version, 400)
    raise ProtocolError("malformed request line", 400)  # pragma: no cover - unreachable


def _parse_status_line(line: bytes) -> tuple[str, int, str]:
    # status-line = HTTP-version SP status-code SP [ reason-phrase ]; like h11 (and most
    # clients) we also accept a missing final SP, which real servers omit.
    parts = line.split(b" ", 2)
    if len(parts) < 2:
        raise ProtocolError("status line is not 'version SP status SP reason'", 502)
    version = _version(parts[0], 502)
    code = parts[1]
    if len(code) != 3 or not code.isdigit() or code[0] == 0x30:
        raise ProtocolError("status code is not three digits (100-999)", 502)
    reason = parts[2] if len(parts) == 3 else b""
    if reason.translate(None, _FIELD_TEXT):
        raise ProtocolError(_bad_field_value(reason), 502)
    return version, int(code), reason.decode("latin-1")


def _version(raw: bytes, status: int) -> str:
    version = _VERSIONS.get(raw)
    if version is not None:
        return version
    if _OTHER_VERSION.fullmatch(raw):
        raise ProtocolError("HTTP version not supported", 505 if status == 400 else status)
    raise ProtocolError("malformed HTTP version", status)


def _parse_fields(
    block: bytes, status: int
) -> tuple[tuple[tuple[str, str], ...], dict[str, list[str]]]:
    """(headers, the values of the fields in `_WATCHED` by lowercased name).

    The whole block is validated by one regular expression (each line `token ":"
    field-text`: so no bare CR or LF, no obs-fold, no whitespace before the colon, no control
    character); only a failing block is walked line by line, for the error message.
    """
    if _FIELD_BLOCK.fullmatch(block) is None:
        raise ProtocolError(_bad_field_block(block), status)
    lines = block.decode("latin-1").split("\r\n")
    headers = []
    special: dict[str, list[str]] = {}
    for i in range(1, len(lines)):
        name, _, value = lines[i].partition(":")
        value = value.strip(" \t")
        headers.append((name, value))
        key = name.lower()
        if key in _WATCHED:
            special.setdefault(key, []).append(value)
    return tuple(headers), special


_WATCHED = frozenset(
    {"content-length", "transfer-encoding", "connection", "host"}
    | {"content_length", "transfer_encoding"}
)
_FIELD_BLOCK = re.compile(rb"(?:\r\n[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[\t\x20-\x7e\x80-\xff]*)*")


def _bad_field_block(block: bytes) -> str:
    for line in block.split(b"\r\n")[1:]:
        name, colon, value = line.partition(b":")
        if not name or name.translate(None, _TCHAR):
            return _bad_field_line(line, colon)
        if value.translate(None, _FIELD_TEXT):
            return _bad_field_value(value)
    return "malformed header field"


def _bad_field_line(line: bytes, colon: bytes) -> str:
    if line[:1] in (b" ", b"\t"):
        return "obs-fold (a header line starting with whitespace) is not accepted"
    if b"\r" in line or b"\n" in line:
        return "bare CR or LF in head (lines must end in CRLF)"
    if not colon:
        return "header line without a colon"
    name = line.partition(b":")[0]
    if name.rstrip(_OWS) != name:
        return "whitespace between header name and colon"
    return "header name is not a token"


def _bad_field_value(value: bytes) -> str:
    if b"\r" in value or b"\n" in value:
        return "bare CR or LF in head (lines must end in CRLF)"
    return "control character in a header value"


def _keep_alive(version: str, special: dict[str, list[str]]) -> bool:
    connection = special.get("connection")
    if connection is None:
        return version == "HTTP/1.1"
    tokens = _tokens(connection)
    if version == "HTTP/1.1":
        return "close" not in tokens
    return "keep-alive" in tokens and "close" not in tokens


def _tokens(values: list[str]) -> frozenset[str]:
    if len(values) == 1 and "," not in values[0]:  # the usual `Connection: keep-alive`
        return frozenset((values[0].lower(),)) - _EMPTY
    return frozenset([t.strip(" \t").lower() for v in values for t in v.split(",")]) - _EMPTY


_EMPTY = frozenset({""})


def _content_length(values: list[str], status: int) -> int:
    if len(values) != 1:
        raise ProtocolError("more than one Content-Length header field", status)
    value = values[0]
    if not (value.isascii() and value.isdigit()):
        raise ProtocolError("Content-Length is not a single decimal number", status)
    if len(value) > MAX_CONTENT_LENGTH_DIGITS:
        raise ProtocolError("Content-Length is too long", status)
    return int(value)


def _request_framing(version: str, special: dict[str, list[str]]) -> BodyFraming:
    # RFC 9112 6.1-6.3, refusing every shape that two parsers could read differently.
    cl = special.get("content-length")
    te = special.get("transfer-encoding")
    if "content_length" in special or "transfer_encoding" in special:
        # CGI-style servers (WSGI, PHP) map '_' to '-', and would frame by this field.
        raise ProtocolError("underscore spelling of a framing header field", 400)
    if te:
        if version == "HTTP/1.0":
            raise ProtocolError("Transfer-Encoding in an HTTP/1.0 request", 400)
        if cl:
            raise ProtocolError("both Transfer-Encoding and Content-Length", 400)
        if len(te) != 1 or te[0].lower() != "chunked":
            raise ProtocolError("Transfer-Encoding other than a single 'chunked'", 400)
        return CHUNKED
    if cl:
        return BodyFraming("length", _content_length(cl, 400))
    return NO_BODY


def _response_framing(version: str, special: dict[str, list[str]]) -> BodyFraming:
    # RFC 9112 6.3 items 3-7; a 1.0 response with Transfer-Encoding is faulty (6.1), and
    # both framing fields at once is refused rather than resolved in favour of chunked.
    cl = special.get("content-length")
    te = special.get("transfer-encoding")
    if te:
        if version == "HTTP/1.0":
            raise ProtocolError("Transfer-Encoding in an HTTP/1.0 response", 502)
        if cl:
            raise ProtocolError("both Transfer-Encoding and Content-Length", 502)
        codings = [c.strip(" \t").lower() for v in te for c in v.split(",")]
        if "" in codings or "chunked" in codings[:-1]:
            raise ProtocolError("malformed Transfer-Encoding", 502)
        return CHUNKED if codings[-1] == "chunked" else UNTIL_CLOSE
    if cl:
        return BodyFraming("length", _content_length(cl, 502))
    return UNTIL_CLOSE

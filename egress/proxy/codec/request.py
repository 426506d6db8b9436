"""Request heads: `parse_request_head` and the request line and framing rules it applies
(pure, stdlib only; docs/wire.md). Imported through `http1.py`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NoReturn

from egress.errors import ProtocolError
from egress.proxy.codec.fields import (
    CHUNKED,
    MAX_LEADING_EMPTY_LINES,
    MAX_REQUEST_HEAD_SIZE,
    MAX_REQUEST_HEADERS,
    NO_BODY,
    TCHAR,
    VCHAR,
    BodyFraming,
    FieldBlock,
    as_bytes,
    content_length_of,
    keep_alive_of,
    parse_fields,
    split_head,
    version_of,
)


@dataclass(frozen=True, slots=True, repr=False)
class RequestHead(FieldBlock):
    """A parsed request head. `target` is exactly as sent; `headers` keep order and case.

    Its repr hides the values of Authorization, Proxy-Authorization, Cookie and Set-Cookie.
    """

    method: str
    target: str
    version: str
    headers: tuple[tuple[str, str], ...]
    keep_alive: bool
    framing: BodyFraming


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
    data = as_bytes(buf, max_size)
    split = split_head(data, skip_empty_lines(data), max_size, max_headers, 400, searched)
    if split is None:
        return None
    first, block, consumed = split
    method, target, version = parse_request_line(first)
    headers, special = parse_fields(block, 400)
    if len(special.get("host", ())) > 1:
        raise ProtocolError("more than one Host header field", 400)
    framing = request_framing(version, special)
    keep_alive = keep_alive_of(version, special)
    return RequestHead(method, target, version, headers, keep_alive, framing), consumed


def skip_empty_lines(data: bytes | bytearray) -> int:
    if not data.startswith(b"\r\n"):
        return 0
    start = 0
    for _ in range(MAX_LEADING_EMPTY_LINES):
        if not data.startswith(b"\r\n", start):
            break
        start += 2
    return start


def parse_request_line(line: bytes) -> tuple[str, str, str]:
    if REQUEST_LINE.fullmatch(line) is not None:
        method, target, version = line.decode("ascii").split(" ")
        return method, target, version
    return bad_request_line(line)


# request-line = method SP request-target SP HTTP-version (RFC 9112 3): the target is any
# run of visible ASCII (so no CR, LF, HTAB, control or non-ASCII byte).
REQUEST_LINE = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+ [\x21-\x7e]+ HTTP/1\.[01]")


def bad_request_line(line: bytes) -> NoReturn:
    if b"\r" in line or b"\n" in line:
        raise ProtocolError("bare CR or LF in head (lines must end in CRLF)", 400)
    parts = line.split(b" ")
    if len(parts) != 3:
        raise ProtocolError("request line is not 'method SP target SP version'", 400)
    method, target, version = parts
    if not method or method.translate(None, TCHAR):
        raise ProtocolError("request method is not a token", 400)
    if not target or target.translate(None, VCHAR):
        raise ProtocolError("request target is empty or has a non-visible character", 400)
    version_of(version, 400)
    raise ProtocolError("malformed request line", 400)  # pragma: no cover - unreachable


def request_framing(version: str, special: dict[str, list[str]]) -> BodyFraming:
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
        return BodyFraming("length", content_length_of(cl, 400))
    return NO_BODY

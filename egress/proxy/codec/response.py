"""Response heads: `parse_response_head` and the status line and framing rules it applies
(pure, stdlib only; docs/wire.md). Imported through `http1.py`."""

from __future__ import annotations

from dataclasses import dataclass

from egress.errors import ProtocolError
from egress.proxy.codec.fields import (
    CHUNKED,
    FIELD_TEXT,
    MAX_RESPONSE_HEAD_SIZE,
    MAX_RESPONSE_HEADERS,
    NO_BODY,
    UNTIL_CLOSE,
    BodyFraming,
    FieldBlock,
    as_bytes,
    bad_field_value,
    content_length_of,
    keep_alive_of,
    parse_fields,
    split_head,
    version_of,
)


@dataclass(frozen=True, slots=True, repr=False)
class ResponseHead(FieldBlock):
    """A parsed response head; `framing` already accounts for the request method.

    Its repr hides credential and cookie values, like `RequestHead`'s.
    """

    version: str
    status: int
    reason: str
    headers: tuple[tuple[str, str], ...]
    keep_alive: bool
    framing: BodyFraming


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
    data = as_bytes(buf, max_size)
    split = split_head(data, 0, max_size, max_headers, 502, searched)
    if split is None:
        return None
    first, block, consumed = split
    version, status, reason = parse_status_line(first)
    headers, special = parse_fields(block, 502)
    framing = response_framing(version, special)
    leaves_http = status == 101 or (request_method == "CONNECT" and 200 <= status < 300)
    if leaves_http or request_method == "HEAD" or status < 200 or status in (204, 304):
        framing = NO_BODY
    keep_alive = keep_alive_of(version, special) and framing is not UNTIL_CLOSE and not leaves_http
    return ResponseHead(version, status, reason, headers, keep_alive, framing), consumed


def parse_status_line(line: bytes) -> tuple[str, int, str]:
    # status-line = HTTP-version SP status-code SP [ reason-phrase ]; like h11 (and most
    # clients) we also accept a missing final SP, which real servers omit.
    parts = line.split(b" ", 2)
    if len(parts) < 2:
        raise ProtocolError("status line is not 'version SP status SP reason'", 502)
    version = version_of(parts[0], 502)
    code = parts[1]
    if len(code) != 3 or not code.isdigit() or code[0] == 0x30:
        raise ProtocolError("status code is not three digits (100-999)", 502)
    reason = parts[2] if len(parts) == 3 else b""
    if reason.translate(None, FIELD_TEXT):
        raise ProtocolError(bad_field_value(reason), 502)
    return version, int(code), reason.decode("latin-1")


def response_framing(version: str, special: dict[str, list[str]]) -> BodyFraming:
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
        return BodyFraming("length", content_length_of(cl, 502))
    return UNTIL_CLOSE

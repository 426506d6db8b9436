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

The module is split along those seams (docs/architecture.md): what both heads share is
`fields.py`, the request parser `request.py`, the response parser `response.py`.
Every name stays importable from here, the one module the rest of the proxy imports.
"""

from __future__ import annotations

from egress.proxy.codec.fields import CHUNKED as CHUNKED
from egress.proxy.codec.fields import EMPTY as EMPTY
from egress.proxy.codec.fields import FIELD_BLOCK as FIELD_BLOCK
from egress.proxy.codec.fields import FIELD_TEXT as FIELD_TEXT
from egress.proxy.codec.fields import HOP_BY_HOP as HOP_BY_HOP
from egress.proxy.codec.fields import MAX_CHUNK_LINE as MAX_CHUNK_LINE
from egress.proxy.codec.fields import MAX_CHUNK_SIZE_DIGITS as MAX_CHUNK_SIZE_DIGITS
from egress.proxy.codec.fields import MAX_CONTENT_LENGTH_DIGITS as MAX_CONTENT_LENGTH_DIGITS
from egress.proxy.codec.fields import MAX_LEADING_EMPTY_LINES as MAX_LEADING_EMPTY_LINES
from egress.proxy.codec.fields import (
    MAX_REQUEST_HEAD_SIZE,
    MAX_REQUEST_HEADERS,
    MAX_RESPONSE_HEAD_SIZE,
    MAX_RESPONSE_HEADERS,
    BodyFraming,
)
from egress.proxy.codec.fields import MAX_TRAILER_FIELDS as MAX_TRAILER_FIELDS
from egress.proxy.codec.fields import MAX_TRAILER_SIZE as MAX_TRAILER_SIZE
from egress.proxy.codec.fields import NEVER_HOP_BY_HOP as NEVER_HOP_BY_HOP
from egress.proxy.codec.fields import NO_BODY as NO_BODY
from egress.proxy.codec.fields import OTHER_VERSION as OTHER_VERSION
from egress.proxy.codec.fields import OWS as OWS
from egress.proxy.codec.fields import SECRETS as SECRETS
from egress.proxy.codec.fields import STATUS_431 as STATUS_431
from egress.proxy.codec.fields import TCHAR as TCHAR
from egress.proxy.codec.fields import UNTIL_CLOSE as UNTIL_CLOSE
from egress.proxy.codec.fields import VCHAR as VCHAR
from egress.proxy.codec.fields import VERSIONS as VERSIONS
from egress.proxy.codec.fields import WATCHED as WATCHED
from egress.proxy.codec.fields import FieldBlock as FieldBlock
from egress.proxy.codec.fields import FramingKind as FramingKind
from egress.proxy.codec.fields import as_bytes as as_bytes
from egress.proxy.codec.fields import bad_field_block as bad_field_block
from egress.proxy.codec.fields import bad_field_line as bad_field_line
from egress.proxy.codec.fields import bad_field_value as bad_field_value
from egress.proxy.codec.fields import check_partial as check_partial
from egress.proxy.codec.fields import content_length_of as content_length_of
from egress.proxy.codec.fields import keep_alive_of as keep_alive_of
from egress.proxy.codec.fields import parse_fields as parse_fields
from egress.proxy.codec.fields import split_head as split_head
from egress.proxy.codec.fields import tokens_of as tokens_of
from egress.proxy.codec.fields import version_of as version_of
from egress.proxy.codec.request import REQUEST_LINE as REQUEST_LINE
from egress.proxy.codec.request import RequestHead, parse_request_head
from egress.proxy.codec.request import bad_request_line as bad_request_line
from egress.proxy.codec.request import parse_request_line as parse_request_line
from egress.proxy.codec.request import request_framing as request_framing
from egress.proxy.codec.request import skip_empty_lines as skip_empty_lines
from egress.proxy.codec.response import ResponseHead, parse_response_head
from egress.proxy.codec.response import parse_status_line as parse_status_line
from egress.proxy.codec.response import response_framing as response_framing

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

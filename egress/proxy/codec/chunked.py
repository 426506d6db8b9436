"""`ChunkedScanner`: where a chunked body ends, validated as it is relayed (docs/wire.md).

Pure, stdlib only; shares the field rules and limits of `fields.py`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import NoReturn

from egress.errors import ProtocolError
from egress.proxy.codec.http1 import (
    FIELD_TEXT,
    HOP_BY_HOP,
    MAX_CHUNK_LINE,
    MAX_CHUNK_SIZE_DIGITS,
    MAX_TRAILER_FIELDS,
    MAX_TRAILER_SIZE,
    NEVER_HOP_BY_HOP,
    TCHAR,
    bad_field_line,
)

__all__ = ["ChunkedScanner"]


_TOKEN_RE = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_QUOTED_RE = rb'"(?:[\t !#-\[\]-~\x80-\xff]++|\\[\t -~\x80-\xff])*+"'
# chunk = chunk-size [ chunk-ext ] CRLF (RFC 9112 7.1), without the optional whitespace (BWS)
# the grammar permits around ';' and '=': no real sender emits it, and whitespace in chunk
# lines is a classic source of parser disagreement. Possessive quantifiers: the alternatives
# are disjoint, so nothing is lost, and a failing match never backtracks (at most ~0.3 ms for
# a worst-case 4 KiB line).
_CHUNK_LINE = re.compile(
    rb"([0-9A-Fa-f]{1,%d})(?:;%s(?:=(?:%s|%s))?)*+\r\n"
    % (MAX_CHUNK_SIZE_DIGITS, _TOKEN_RE, _TOKEN_RE, _QUOTED_RE)
)

# Fields that must not appear as trailers (RFC 9110 6.5.1: framing, routing, and the
# hop-by-hop fields we could not remove from relayed bytes); a next hop that merges trailers
# into the header section would otherwise let a client reframe or reroute after our checks.
_FORBIDDEN_TRAILERS = frozenset(name.encode() for name in HOP_BY_HOP | NEVER_HOP_BY_HOP)

_SIZE, _DATA, _DATA_END, _TRAILER, _DONE = range(5)
_LineHandler = Callable[[bytes], None]


class ChunkedScanner:
    """Find where a chunked body ends, validating it, without changing a byte.

    Feed it the bytes that follow a head with chunked framing; `feed` returns how many of
    them belong to the body (relay exactly those); once `done`, the rest of the buffer is the
    next message. Works on input split anywhere, and keeps at most one line in memory
    (`MAX_CHUNK_LINE` for a chunk-size line, `MAX_TRAILER_SIZE` for the trailer section).

    Strict, per RFC 9112 7.1: chunk-size is 1 to 16 hex digits with nothing around it;
    extensions are `;name` or `;name=token-or-quoted-string` with no whitespace; chunk data is
    followed by exactly CRLF; trailer fields obey the head's field rules, and framing, routing
    and hop-by-hop fields (Content-Length, Host, Connection, ...) are refused as trailers,
    since a next hop might merge them into the header section. Anything else raises
    `ProtocolError(..., error_status)` (400 by default; pass 502 for upstream responses); the
    scanner is then unusable and the connection must be closed.
    """

    __slots__ = ("_crlf", "_error_status", "_fields", "_line", "_remaining", "_state", "_trailer")

    def __init__(self, *, error_status: int = 400) -> None:
        self._error_status = error_status
        self._state = _SIZE
        self._remaining = 0  # chunk data bytes still expected
        self._crlf = 0  # bytes of the CRLF after chunk data seen so far
        self._line = bytearray()  # an incomplete line, bounded
        self._trailer = 0  # bytes of the trailer section seen so far
        self._fields = 0  # trailer field lines seen so far

    @property
    def done(self) -> bool:
        """True once the last chunk and the trailer section (with its CRLF) were consumed."""
        return self._state == _DONE

    def feed(self, data: bytes | bytearray | memoryview) -> int:
        """Scan `data`; return how many of its leading bytes belong to the body.

        Fewer than `len(data)` only when the body ended inside `data`. Raises `ProtocolError`.
        """
        pos, end = 0, len(data)
        while pos < end and self._state != _DONE:
            state = self._state
            if state == _DATA:
                step = min(self._remaining, end - pos)
                self._remaining -= step
                pos += step
                if not self._remaining:
                    self._state = _DATA_END
            elif state == _DATA_END:
                if data[pos] != b"\r\n"[self._crlf]:
                    self._fail("chunk data not followed by CRLF")
                pos += 1
                self._crlf += 1
                if self._crlf == 2:
                    self._crlf = 0
                    self._state = _SIZE
            elif state == _SIZE:
                pos = self._scan_line(data, pos, MAX_CHUNK_LINE, self._on_size_line)
            else:
                budget = MAX_TRAILER_SIZE - self._trailer
                pos = self._scan_line(data, pos, budget, self._on_trailer_line)
        return pos

    def _scan_line(
        self, data: bytes | bytearray | memoryview, pos: int, budget: int, on_line: _LineHandler
    ) -> int:
        room = budget - len(self._line)
        window = bytes(data[pos : pos + room])
        lf = window.find(b"\n")
        if lf < 0:
            if len(window) >= room:
                self._fail("chunk-size line or trailer section too long")
            self._line += window
            return pos + len(window)
        line = bytes(self._line) + window[: lf + 1]
        self._line.clear()
        on_line(line)
        return pos + lf + 1

    def _on_size_line(self, line: bytes) -> None:
        match = _CHUNK_LINE.fullmatch(line)
        if match is None:
            self._fail("malformed chunk-size line")
        size = int(match.group(1), 16)
        if size:
            self._remaining = size
            self._state = _DATA
        else:
            self._state = _TRAILER

    def _on_trailer_line(self, line: bytes) -> None:
        self._trailer += len(line)
        if not line.endswith(b"\r\n") or b"\r" in line[:-2]:
            self._fail("bare CR or LF in trailer section")
        if line == b"\r\n":
            self._state = _DONE
            return
        self._fields += 1
        if self._fields > MAX_TRAILER_FIELDS:
            self._fail("too many trailer fields")
        field = line[:-2]
        name, colon, value = field.partition(b":")
        if not name or name.translate(None, TCHAR):
            self._fail("trailer " + bad_field_line(field, colon))
        if value.translate(None, FIELD_TEXT):
            self._fail("control character in trailer field")
        if name.lower() in _FORBIDDEN_TRAILERS:
            self._fail(f"{name.decode('ascii')} is not allowed in a trailer section")

    def _fail(self, message: str) -> NoReturn:
        raise ProtocolError(message, self._error_status)

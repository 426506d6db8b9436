"""Heads as the proxy sends them on: hop-by-hop fields removed, `Host` set, serialization,
and byte-for-byte passthrough when nothing needs rewriting (docs/wire.md).

Pure, stdlib only: works on the heads `http1.py` parsed and validated.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from egress.proxy.codec.http1 import HOP_BY_HOP, NEVER_HOP_BY_HOP, RequestHead, ResponseHead

__all__ = [
    "forward_headers",
    "forward_response_headers",
    "passthrough_request_head",
    "passthrough_response_head",
    "serialize_request_head",
    "serialize_response_head",
]


def forward_headers(head: RequestHead, host_header: str) -> list[tuple[str, str]]:
    """The fields to send upstream: hop-by-hop fields removed, Host set to `host_header`.

    `host_header` comes from the request target the policy judged; a client Host that
    disagrees is replaced in place (it never wins), and a missing one is added first.
    `Content-Length` and `Transfer-Encoding` are kept, even if `Connection` names them,
    because the body is relayed with its original framing.
    """
    drop = HOP_BY_HOP | (head.connection_tokens - NEVER_HOP_BY_HOP)
    out: list[tuple[str, str]] = []
    has_host = False
    for name, value in head.headers:
        key = name.lower()
        if key == "host":
            if not has_host:
                out.append((name, host_header))
                has_host = True
        elif key not in drop:
            out.append((name, value))
    if not has_host:
        out.insert(0, ("Host", host_header))
    return out


def forward_response_headers(head: ResponseHead) -> list[tuple[str, str]]:
    """The response fields to relay to the client, hop-by-hop fields removed.

    Framing fields are kept (see `forward_headers`); the body is relayed unchanged.
    """
    drop = HOP_BY_HOP | (head.connection_tokens - NEVER_HOP_BY_HOP)
    return [(n, v) for n, v in head.headers if n.lower() not in drop]


# A hop-by-hop field name at the start of a line of a *validated* head (names are tokens, so
# "\r\nNAME:" can only be a field line). One C-level scan instead of a loop over fields.
_HOP_BY_HOP_LINE = re.compile(
    rb"\r\n(?:" + b"|".join(re.escape(n.encode()) for n in sorted(HOP_BY_HOP)) + rb"):",
    re.IGNORECASE,
)


def _needs_rewrite(raw: bytes) -> bool:
    return _HOP_BY_HOP_LINE.search(raw) is not None


def passthrough_request_head(
    head: RequestHead, raw: bytes, path: str, host_header: str
) -> bytes | None:
    """The upstream head built from the client's own bytes, or None if it needs rewriting.

    Fast path for the common request: no hop-by-hop field, exactly one Host that already says
    `host_header`. Then the validated field block is forwarded byte for byte after a new
    request line (origin-form `path`); otherwise use `forward_headers` and
    `serialize_request_head`. `raw` is the exact head `parse_request_head` consumed.
    """
    if _needs_rewrite(raw):
        return None
    hosts = [v for n, v in head.headers if len(n) == 4 and n.lower() == "host"]
    if hosts != [host_header]:
        return None
    body = raw.lstrip(b"\r\n")
    start = body.find(b"\r\n") + 2
    line = f"{head.method} {path} {head.version}\r\n".encode("latin-1")
    return line + body[start:]


def passthrough_response_head(head: ResponseHead, raw: bytes) -> bytes | None:
    """`raw` itself when the response head can be relayed unchanged, else None.

    True for an HTTP/1.1 response without hop-by-hop fields; the caller must also not need
    to add a field of its own (such as `Connection: close`).
    """
    if head.version != "HTTP/1.1" or _needs_rewrite(raw):
        return None
    return raw


def serialize_request_head(
    method: str,
    target: str,
    headers: Iterable[tuple[str, str]],
    *,
    version: str = "HTTP/1.1",
) -> bytes:
    """Encode a request head (latin-1), ending with the blank line.

    Forward an HTTP/1.0 client's request with `version="HTTP/1.0"` so that the upstream does
    not answer with chunked framing the client cannot read.

    Raises ValueError if any part would inject a line (CR, LF) — a programming error, since
    parsed heads cannot contain one; UnicodeEncodeError for a non-latin-1 character.
    """
    return _serialize(f"{method} {target} {version}", headers)


def serialize_response_head(
    status: int, reason: str, headers: Iterable[tuple[str, str]], *, version: str = "HTTP/1.1"
) -> bytes:
    """Encode a response head (latin-1), ending with the blank line. Raises like
    `serialize_request_head`."""
    return _serialize(f"{version} {status:03d} {reason}", headers)


def _serialize(start_line: str, headers: Iterable[tuple[str, str]]) -> bytes:
    parts = [start_line]
    parts.extend(f"{n}: {v}" for n, v in headers)
    parts.append("\r\n")
    text = "\r\n".join(parts)
    lines = len(parts)
    if text.count("\r") != lines or text.count("\n") != lines or "\0" in text:
        raise ValueError("CR, LF or NUL inside a head field")
    return text.encode("latin-1")

"""Error responses the proxy writes itself: status, RFC 9209 `Proxy-Status`, one-line body.

Pure. Every refusal names its cause twice: a machine-readable `Proxy-Status` error type
(RFC 9209 section 2.3) and a one-line plain-text body saying which rule or guard refused, so an
agent reading the body, or a human reading curl's output, sees why.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...reasons import Reason
from .actions import Refuse

PROXY_NAME = "egress"
_NOT_PRINTABLE = re.compile(r"[^\x20-\x7e]")


@dataclass(frozen=True, slots=True)
class Refusal:
    """How one reason code is answered."""

    status: int
    error: str  # RFC 9209 Proxy-Status error type


# reason code -> answer, from the one vocabulary (`reasons.Reason`, docs/proxy.md#error-responses).
# The SNI reasons are in it although a tunnel refused after its `200` gets no answer.
REFUSALS: dict[str, Refusal] = {r.value: Refusal(r.status, r.error) for r in Reason if r.answered}

_REASON_PHRASES = {
    400: "Bad Request",
    403: "Forbidden",
    407: "Proxy Authentication Required",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
    505: "HTTP Version Not Supported",
}


def _sf_string(text: str) -> str:
    """An RFC 8941 sf-string: printable ASCII, `\\` and `"` escaped."""
    clean = _NOT_PRINTABLE.sub("?", text)
    return '"' + clean.replace("\\", "\\\\").replace('"', '\\"') + '"'


def refusal_for(reason: str, status: int | None = None) -> Refusal:
    """How `reason` is answered (`status` overrides, e.g. 505 for `bad_request`).

    Raises KeyError for a code that is not an answered `Reason`: an unknown reason is a bug
    to fix, not something to paper over with a guessed 502.
    """
    try:
        base = REFUSALS[reason]
    except KeyError:
        raise KeyError(f"no error response for reason {reason!r} (see egress.reasons)") from None
    return Refusal(status, base.error) if status is not None else base


def error_response(
    reason: str, detail: str, *, status: int | None = None, close: bool = True
) -> tuple[int, bytes]:
    """The status and the full bytes of the response for a refusal with `reason`."""
    refusal = refusal_for(reason, status)
    body = f"egress: {refusal.status} {reason}: {detail}\n".encode("utf-8", "replace")
    lines = [
        # the reason code in the status line too: many clients show only the status line of a
        # refused CONNECT and drop its body (docs/proxy.md#refusals)
        f"HTTP/1.1 {refusal.status} {_REASON_PHRASES.get(refusal.status, 'Error')} "
        f"({PROXY_NAME}: {_NOT_PRINTABLE.sub('?', reason)})",
        f"Proxy-Status: {PROXY_NAME}; error={refusal.error}; details={_sf_string(detail)}",
        "Content-Type: text/plain; charset=utf-8",
        f"Content-Length: {len(body)}",
    ]
    if refusal.status == 407:
        lines.append('Proxy-Authenticate: Basic realm="egress"')
    if close:
        lines.append("Connection: close")
    return refusal.status, ("\r\n".join(lines) + "\r\n\r\n").encode("ascii") + body


def render_refusal(action: Refuse, *, close: bool = True) -> bytes:
    """The bytes of a refusal by an HTTP front-end (empty when its answer is a plain close)."""
    if action.answer.style != "http":
        return b""
    verdict = action.verdict
    _, data = error_response(verdict.reason, verdict.detail, status=action.answer.code, close=close)
    return data


CONNECT_OK = b"HTTP/1.1 200 Connection established\r\n\r\n"

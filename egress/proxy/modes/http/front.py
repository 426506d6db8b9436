"""The HTTP forward proxy's front-end: absolute-form requests, refused with an HTTP status.

Pure. Every reason the proxy answers has its status (and RFC 9209 `Proxy-Status`) in the one
vocabulary (`reasons.Reason`); a reason without one closes the connection unanswered
(docs/proxy.md#error-responses).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from ....reasons import Reason
from ...core.actions import Refuse
from ...core.intent import CLOSE, Answer, Front
from ...core.responses import error_response


def http_answers() -> Mapping[Reason, Answer]:
    """Reason -> answer for both HTTP front-ends (requests and CONNECT)."""
    return {r: Answer("http", r.status) if r.answered else CLOSE for r in Reason}


HTTP: Final = Front("http", None, "request", None, http_answers())


def render_refusal(action: Refuse, *, close: bool = True) -> bytes:
    """The bytes of an HTTP refusal (empty when the answer is a plain close)."""
    if action.answer.style != "http":
        return b""
    verdict = action.verdict
    _, data = error_response(verdict.reason, verdict.detail, status=action.answer.code, close=close)
    return data


__all__ = ["HTTP", "http_answers", "render_refusal"]

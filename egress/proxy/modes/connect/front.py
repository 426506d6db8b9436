"""The CONNECT front-end: a tunnel opened with `200`, refused with an HTTP status before it.

Pure. After its `200` a tunnel refused (by the SNI check) is closed, nothing more said
(docs/proxy.md#tls-sni-check); the exchange then answers `close`, whatever the reason.
"""

from __future__ import annotations

from typing import Final

from ...core.intent import Answer, Front
from ..http.front import http_answers, render_refusal

CONNECT: Final = Front("connect", None, "tunnel", Answer("http", 200), http_answers(), 200)


__all__ = ["CONNECT", "render_refusal"]

"""The transparent front-end: redirected TCP, refused with a reset.

Pure. A redirected tunnel (TLS judged by its SNI, or raw TCP) has no protocol to answer in,
so every refusal is a TCP reset (`end: reset`); its port-80 requests are HTTP requests and
answered as the forward proxy's are (docs/proxy.md#transparent-mode-and-socks5).
"""

from __future__ import annotations

from typing import Final

from ....reasons import Reason
from ...core.intent import CLOSE, NEVER_REFUSED, RESET, Front
from ..http import http_answers

TRANSPARENT: Final = Front(
    "transparent",
    "transparent",
    "tunnel",
    None,
    {r: CLOSE if r in NEVER_REFUSED else RESET for r in Reason},
)
# port 80 through a transparent listener: requests, answered in HTTP, recorded `transparent`
TRANSPARENT_HTTP: Final = Front("transparent-http", "transparent", "request", None, http_answers())

__all__ = ["TRANSPARENT", "TRANSPARENT_HTTP"]

"""Transparent connections (redirected by netfilter): not served yet, so refused."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .server import EgressProxy, _Conn


async def serve_transparent(proxy: EgressProxy, conn: _Conn) -> None:
    """Refuse (fail closed) and audit."""
    event = proxy._event(conn, "CONNECT", "https", "", 0)
    event["mode"] = "transparent"
    proxy._emit(event, "error", "not_supported", None, "transparent mode not built", None)

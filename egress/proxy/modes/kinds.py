"""A listener's mode, chosen once when it opens: which front-ends its connections use.

Pure. The listener kinds (`http`, `socks5`, `transparent`, `dns`, and an `http` listener bound
to a framework route) become one `ListenerMode` object each, so the shell asks the object
rather than testing the kind's string in several places (docs/architecture.md#one-exchange).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from ..core.intent import Front
from .connect.front import CONNECT
from .dns.front import DNS
from .forwarder.front import FORWARDER
from .http.front import HTTP
from .socks5.front import SOCKS5
from .transparent.front import TRANSPARENT, TRANSPARENT_HTTP


@dataclass(frozen=True, slots=True)
class ListenerMode:
    """What a listener speaks: its front-ends, and whether a refusal at accept is answered
    in HTTP (a forward proxy listener) or the socket just closed (no protocol to answer in)."""

    name: str
    fronts: tuple[Front, ...]
    answers_at_accept: bool
    fast_path: bool  # kept-alive requests may be served from callbacks (docs/architecture.md)
    # the front-end of its HTTP requests (a transparent listener's port 80 records its mode)
    request_front: Front = HTTP


PROXY: Final = ListenerMode("http", (HTTP, CONNECT), answers_at_accept=True, fast_path=True)
ROUTE: Final = ListenerMode("forward", (FORWARDER,), answers_at_accept=False, fast_path=False)
SOCKS: Final = ListenerMode("socks5", (SOCKS5,), answers_at_accept=False, fast_path=False)
REDIRECTED: Final = ListenerMode(
    "transparent",
    (TRANSPARENT, TRANSPARENT_HTTP),
    answers_at_accept=False,
    fast_path=False,
    request_front=TRANSPARENT_HTTP,
)
RESOLVER: Final = ListenerMode("dns", (DNS,), answers_at_accept=False, fast_path=False)
MODES: Final = {m.name: m for m in (PROXY, SOCKS, REDIRECTED, RESOLVER)}


def mode_for(kind: str, forwarding: bool) -> ListenerMode:
    """The mode of a listener of `kind` (`forwarding`: bound to a framework route)."""
    if forwarding:
        return ROUTE
    try:
        return MODES[kind]
    except KeyError:
        raise ValueError(f"unknown listener kind {kind!r}") from None


__all__ = ["MODES", "PROXY", "REDIRECTED", "RESOLVER", "ROUTE", "SOCKS", "ListenerMode", "mode_for"]

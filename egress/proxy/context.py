"""`ProxyContext`: what the parts of one `EgressProxy` share, owned in one place.

Shell (it holds live connections and listening sockets, and does no I/O of its own). The
proxy (`server.py`) makes one and hands it to its components, `ClientControl`
(`tenants.py`), `ListenerControl` (`endpoints.py`) and `Intake` (`intake.py`): each reads and
changes the shared state here, never the proxy, so no component holds `EgressProxy` and no
import runs back to `server.py` (docs/architecture.md#egress-who-owns-what). The
configuration in force (`settings`, the `gate` that judges by it, the `resolver` of its pins)
is swapped here on a reload; the running parts (`loop`, `steps`, `pool`) are set once, by
`EgressProxy.start`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio

    from ..config import Settings
    from .core.gate import Gate
    from .net.conn import Conn
    from .net.listener import Listener
    from .net.pool import UpstreamPool
    from .net.resolve import Resolver
    from .runtime import AuditSink, Steps


class ProxyContext:
    """The configuration in force, the listeners, the open connections and, once started,
    the running parts of one proxy."""

    __slots__ = (
        "addresses",
        "audit",
        "conns",
        "gate",
        "listeners",
        "loop",
        "pool",
        "resolver",
        "settings",
        "steps",
    )

    def __init__(
        self, settings: Settings, gate: Gate, resolver: Resolver, audit: AuditSink | None
    ) -> None:
        self.settings = settings
        self.gate = gate
        self.resolver = resolver
        self.audit = audit
        self.listeners: list[Listener] = []
        self.conns: set[Conn] = set()
        # the proxy's own listen addresses, as bound (`EgressProxy.addresses`)
        self.addresses: list[tuple[str, int]] = []
        # the running parts, set by `EgressProxy.start`
        self.loop: asyncio.AbstractEventLoop | None = None
        self.steps: Steps | None = None
        self.pool: UpstreamPool | None = None

    @property
    def started(self) -> bool:
        """Are the running parts there (records can be written, the pool revoked)?"""
        return self.steps is not None


__all__ = ["ProxyContext"]

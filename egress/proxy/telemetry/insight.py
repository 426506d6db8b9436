"""`Operations`: the operators' half of `EgressProxy`'s public API (docs/metrics.md).

Shell. Metrics as plain data, the admin listener (`/metrics`, `/healthz`, `/readyz`,
`admin.py`), and per-execution summaries. A component of `EgressProxy` (`server.py`), handed
the proxy's metrics and observers, never the proxy; readiness is the accepting side's
(`Intake.ready`, `intake.py`), handed to the admin listener as a callable. Its public
methods are the bodies of `EgressProxy`'s of the same name, which document them (once,
where users read).
The counting itself is `Observers` (`observe.py`), fed from the access records.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from .observe import ExecutionSummary, Observers

if TYPE_CHECKING:
    from .admin import AdminServer
    from .metrics import ProxyMetrics

log = logging.getLogger("egress")

# the admin endpoint's own bounds (docs/metrics.md#admin-endpoint-limits): scrapes are short,
# so a few connections, each closed after ADMIN_TIMEOUT seconds whatever it is doing; they
# count in the descriptor budget (fdbudget.py)
ADMIN_MAX_CONNECTIONS = 16
ADMIN_TIMEOUT = 10.0


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_admin_address(host: str, public: bool, what: str) -> None:
    """The admin endpoint on a non-loopback address must be asked for (`admin_public`,
    `--admin-public`): its numbers name every client and destination host seen."""
    if not public and not is_loopback(host):
        raise ValueError(
            f"{what} {host!r} is not a loopback address: /metrics would be open to every "
            "host that can reach it; pass admin_public=True (egress serve --admin-public) "
            "to mean it (docs/metrics.md#admin-endpoint-limits)"
        )


class Operations:
    """What an operator asks the proxy, a component of `EgressProxy`."""

    def __init__(self, metrics: ProxyMetrics | None, observers: Observers) -> None:
        self.counters = metrics  # None: built with metrics=False
        self.observers = observers
        self.admin: AdminServer | None = None  # once started

    def metrics(self) -> dict[str, object]:
        if self.counters is None:
            raise RuntimeError("metrics are disabled (EgressProxy(metrics=False))")
        return self.counters.snapshot()

    @property
    def admin_url(self) -> str | None:
        if self.admin is None or self.admin.address is None:
            return None  # without --admin, aiohttp and prometheus_client are never imported
        from .admin import admin_url

        return admin_url(self.admin.address)

    async def start_admin(
        self, host: str, port: int, ready: Callable[[], tuple[bool, str]]
    ) -> None:
        """Serve `/metrics`, `/healthz` and `/readyz` (answered by `ready`) on `host:port`."""
        from .admin import AdminServer

        if self.counters is None:
            raise ValueError("the admin listener needs metrics (metrics=True)")
        self.admin = AdminServer(self.counters, ready)
        await self.admin.start(host, port, ADMIN_MAX_CONNECTIONS, ADMIN_TIMEOUT)
        if not is_loopback(host):
            log.warning(
                "egress: the admin endpoint listens on %s, not a loopback address: anyone "
                "who can reach it reads /metrics (docs/metrics.md#admin-endpoint-limits)",
                host,
            )

    async def stop_admin(self) -> None:
        if self.admin is not None:
            await self.admin.stop()

    def track_execution(self, client_id: str) -> ExecutionSummary:
        return self.observers.track(client_id)

    def execution_summary(self, client_id: str, *, stop: bool = False) -> ExecutionSummary:
        if stop:
            return self.observers.untrack(client_id)
        return self.observers.summaries.get(client_id) or ExecutionSummary(client_id)


__all__ = ["Operations"]

"""`Operations`: the operators' half of `EgressProxy`'s public API (docs/metrics.md).

Shell. Metrics as plain data, the admin listener (`/metrics`, `/healthz`, `/readyz`,
`admin.py`), readiness, and per-execution summaries. A component of `EgressProxy`
(`server.py`): its public methods are the bodies of `EgressProxy`'s of the same name, which
document them (once, where users read). The counting itself is `Observers` (`observe.py`),
fed from the access records.
"""

from __future__ import annotations

import ipaddress
import logging
from typing import TYPE_CHECKING

from .observe import ExecutionSummary

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


if TYPE_CHECKING:
    from ..server import EgressProxy


class Operations:
    """What an operator asks the proxy, a component of `EgressProxy`."""

    def __init__(self, proxy: EgressProxy) -> None:
        self.proxy = proxy

    def metrics(self) -> dict[str, object]:
        if self.proxy._metrics is None:
            raise RuntimeError("metrics are disabled (EgressProxy(metrics=False))")
        return self.proxy._metrics.snapshot()

    @property
    def admin_url(self) -> str | None:
        if self.proxy.admin is None:
            return None  # without --admin, aiohttp and prometheus_client are never imported
        from .admin import admin_url

        return admin_url(self.proxy.admin.address)

    def ready(self) -> tuple[bool, str]:
        if self.proxy.closing:
            return False, "stopping"
        if not self.proxy.listeners:
            return False, "not listening"
        if self.proxy.audit is not None and not self.proxy.audit.accepting:
            return False, "audit log not accepting"
        return True, "ready"

    async def start_admin(self, host: str, port: int) -> None:
        from .admin import AdminServer

        if self.proxy._metrics is None:
            raise ValueError("the admin listener needs metrics (metrics=True)")
        self.proxy.admin = AdminServer(self.proxy._metrics, self.ready)
        await self.proxy.admin.start(host, port, ADMIN_MAX_CONNECTIONS, ADMIN_TIMEOUT)
        if not is_loopback(host):
            log.warning(
                "egress: the admin endpoint listens on %s, not a loopback address: anyone "
                "who can reach it reads /metrics (docs/metrics.md#admin-endpoint-limits)",
                host,
            )

    def track_execution(self, client_id: str) -> ExecutionSummary:
        return self.proxy.observers.track(client_id)

    def execution_summary(self, client_id: str, *, stop: bool = False) -> ExecutionSummary:
        if stop:
            return self.proxy.observers.untrack(client_id)
        return self.proxy.observers.summaries.get(client_id) or ExecutionSummary(client_id)


__all__ = ["Operations"]

"""The admin listener: `/metrics` (Prometheus text), `/healthz`, `/readyz` (docs/metrics.md).

Strategy: an aiohttp app on its own socket, served from the proxy's event loop. Nothing here
runs per proxied request: the Prometheus exposition is built from `ProxyMetrics` only when
scraped, through a prometheus_client custom collector (the library owns the text format,
escaping and content type; we own the cheap counting). The registry is private to each proxy,
so two embedded proxies never mix their numbers and nothing touches the global registry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from .metrics import ProxyMetrics

HISTOGRAM_HELP = {
    "decision": "Time from a parsed request head to the policy verdict (includes DNS when "
    "the policy needs addresses)",
    "dns": "Time to resolve a destination name",
    "connect": "Time to open an upstream TCP connection (successful attempts)",
    "request": "Time from a parsed request head to its access record (the record's duration)",
}


class _ProxyCollector(Collector):
    """Turns a `ProxyMetrics` into metric families at scrape time."""

    def __init__(self, metrics: ProxyMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        req = CounterMetricFamily(
            "egress_requests",
            "Access records by client, decision and reason (one per "
            "request, tunnel or refusal; equal to the audit log's count)",
            labels=["client", "decision", "reason"],
        )
        for client, decision, reason, n in m.request_series():
            req.add_metric([client, decision, reason], n)
        yield req
        dns = CounterMetricFamily(
            "egress_dns_queries",
            "DNS records (transparent mode's responder) by client, decision and reason",
            labels=["client", "decision", "reason"],
        )
        for client, decision, reason, n in m.dns_series():
            dns.add_metric([client, decision, reason], n)
        yield dns
        up, down = m.byte_series()
        for name, table, text in (
            ("egress_bytes_up", up, "Bytes relayed from clients to upstreams"),
            ("egress_bytes_down", down, "Bytes relayed from upstreams to clients"),
        ):
            fam = CounterMetricFamily(name, text, labels=["client"])
            for client, n in table.items():
                fam.add_metric([client], n)
            yield fam
        yield GaugeMetricFamily(
            "egress_open_connections", "Client connections open now", value=m.open_connections()
        )
        yield GaugeMetricFamily(
            "egress_open_tunnels",
            "CONNECT tunnels and forwarder relays open now",
            value=m.open_tunnels,
        )
        for name, hist in m.histograms():
            buckets = [(_le(b), n) for b, n in hist.cumulative()]
            yield HistogramMetricFamily(
                f"egress_{name}_seconds",
                HISTOGRAM_HELP[name],
                buckets=buckets,
                sum_value=hist.total,
            )


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


def prometheus_text(metrics: ProxyMetrics) -> bytes:
    """The Prometheus text exposition of `metrics` (what /metrics serves)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_ProxyCollector(metrics))
    return generate_latest(registry)


class AdminServer:
    """`/metrics`, `/healthz` (the loop answers) and `/readyz` (listening and able to audit)."""

    def __init__(self, metrics: ProxyMetrics, ready: Callable[[], tuple[bool, str]]) -> None:
        self.metrics = metrics
        self.ready = ready
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_ProxyCollector(metrics))
        self._runner: web.AppRunner | None = None
        self.address: tuple[str, int] | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        return app

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Listen on `host:port` (0 = ephemeral); returns the bound address. OSError."""
        self._runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, reuse_address=True)
        await site.start()
        server = site._server  # aiohttp exposes the bound socket only here
        assert server is not None
        sockname = server.sockets[0].getsockname()  # type: ignore[attr-defined]
        self.address = (str(sockname[0]), int(sockname[1]))
        return self.address

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _metrics(self, _: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, _: web.Request) -> web.Response:
        ok, why = self.ready()
        return web.Response(text=f"{why}\n", status=200 if ok else 503)


def admin_url(address: tuple[str, int]) -> str:
    host, port = address
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


__all__ = ["AdminServer", "admin_url", "prometheus_text"]

"""The admin listener: `/metrics` (Prometheus text), `/healthz`, `/readyz` (docs/metrics.md).

Strategy: an aiohttp app on its own socket, served from the proxy's event loop. Nothing here
runs per proxied request: the Prometheus exposition is built from `ProxyMetrics` only when
scraped, through a prometheus_client custom collector (the library owns the text format,
escaping and content type; we own the cheap counting). The registry is private to each proxy,
so two embedded proxies never mix their numbers and nothing touches the global registry.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from importlib.metadata import PackageNotFoundError, version
from typing import cast

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

from ...compiled import MODULES, compiled_modules
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
        yield build_info()


def build_info() -> GaugeMetricFamily:
    """`egress_build_info{version, compiled} 1`: the package's version, and whether its pure
    core runs compiled (`true`, a wheel built with EGRESS_MYPYC=1), as plain Python (`false`)
    or partly (docs/architecture.md#a-compiled-build)."""
    try:  # the distribution's, as `egress --version` (egress/__init__.py)
        release = version("egress-netcut")
    except PackageNotFoundError:  # pragma: no cover - a source tree that was never installed
        release = "0+unknown"
    done = len(compiled_modules())
    compiled = "true" if done == len(MODULES) else "false" if done == 0 else "partial"
    info = GaugeMetricFamily(
        "egress_build_info",
        "The package's version and whether its pure core runs compiled",
        labels=["version", "compiled"],
    )
    info.add_metric([release, compiled], 1)
    return info


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


class AdminServer:
    """`/metrics`, `/healthz` (the loop answers) and `/readyz` (listening and able to audit)."""

    def __init__(self, metrics: ProxyMetrics, ready: Callable[[], tuple[bool, str]]) -> None:
        self.metrics = metrics
        self.ready = ready
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_ProxyCollector(metrics))
        self._runner: web.AppRunner | None = None
        self._server: asyncio.AbstractServer | None = None
        self.address: tuple[str, int] | None = None
        self.open = 0  # connections open now (bounded by `start`'s `max_connections`)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        return app

    async def start(
        self, host: str, port: int, max_connections: int = 16, lifetime: float = 10.0
    ) -> tuple[str, int]:
        """Listen on `host:port` (0 = ephemeral); returns the bound address. OSError.

        At most `max_connections` at once (beyond: 503 and closed), each closed `lifetime`
        seconds after it was accepted whatever it is doing: a scrape takes milliseconds,
        and idle or trickling connections must not hold descriptors the proxy needs
        (docs/metrics.md#admin-endpoint-limits)."""
        from ..net.listener import listen_socket

        runner = web.AppRunner(
            self.app(), access_log=None, handle_signals=False, keepalive_timeout=lifetime / 2
        )
        self._runner = runner
        await runner.setup()
        handlers = runner.server
        assert handlers is not None
        loop = asyncio.get_running_loop()

        def factory() -> asyncio.Protocol:
            if self.open >= max_connections:
                return _Busy()
            return _Bounded(self, handlers(), loop, lifetime)

        sock = listen_socket(host, port, 16)
        self._server = await loop.create_server(factory, sock=sock)
        sockname = sock.getsockname()
        self.address = (str(sockname[0]), int(sockname[1]))
        return self.address

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
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


BUSY = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class _Busy(asyncio.Protocol):
    """Over the admin endpoint's connection limit: 503 and closed at once (it must not
    hold a descriptor; a client that already sent its request may see a reset instead)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement the interface without subclassing asyncio's
        cast(asyncio.WriteTransport, transport).write(BUSY)
        transport.close()


class _Bounded(asyncio.Protocol):
    """aiohttp's request handler for one connection, counted and closed after `timeout`."""

    def __init__(
        self,
        owner: AdminServer,
        inner: asyncio.Protocol,
        loop: asyncio.AbstractEventLoop,
        timeout: float,
    ) -> None:
        owner.open += 1
        self.owner = owner
        self.inner = inner
        self.loop = loop
        self.timeout = timeout
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.timer = self.loop.call_later(self.timeout, cast(asyncio.Transport, transport).abort)
        self.inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.owner.open -= 1
        if self.timer is not None:
            self.timer.cancel()
        self.inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


def admin_url(address: tuple[str, int]) -> str:
    host, port = address
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


__all__ = ["AdminServer", "admin_url"]

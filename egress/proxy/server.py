"""`EgressProxy`: the asyncio forward proxy (CONNECT tunnels and absolute-form HTTP).

Shell, and thin: the public API, and the start and stop of its parts. It owns five
components, one concept each, and delegates the rest of its public API to them: `tenants`
(`ClientControl`, `tenants.py`: clients and live policy), `endpoints` (`ListenerControl`,
`endpoints.py`: listeners of every kind, the descriptor budget), `intake` (`Intake`,
`intake.py`: accepting connections and serving each, readiness), the sweeper (`Sweeper`,
`sweeper.py`: the timeouts) and `insight` (`Operations`, `telemetry/insight.py`: metrics,
admin listener, execution summaries). What they share (the configuration in force, the
listeners, the open connections) is one `ProxyContext` (`context.py`) that each is handed:
none holds the proxy, none imports this module. Refusals are answered and audit records
written in one place, `runtime.py`. Each client connection runs one coroutine (or callbacks,
`drive/callback.py`): *read head -> gate -> resolve -> gate -> dial -> relay -> record*.
Every decision is the pure gate's (`gate.py`: identity, verdicts, SNI, keep-alive after a
refusal, 1xx/101); the exchanges are `modes/http.py` (absolute-form HTTP on the
upstream `pool.py`), `modes/connect.py` and `modes/forwarder.py` (tunnels and
framework-route forwarders, relayed by `drive/tunnel.py`). See docs/architecture.md.

Every request on a kept-alive client connection is parsed, identified and judged afresh (or
given its connection's kept decision, when nothing that verdict depends on changed:
`core/kept.py`); an upstream connection is reused only for the *checked* address and port,
so reuse never skips a decision. Names are resolved once per decision and only checked
addresses are dialed.

DoS bounds (defaults in `Limits`, docs/proxy.md#limits): head size and field count (`wire`),
head read timeout, connect timeout, idle timeout, maximum concurrent client connections and a
per-client share of them (503 beyond; idle kept-alive connections are reclaimed first),
per-transport write buffers (`relay.WRITE_HIGH_WATER`). A sweeper task enforces the timeouts
once per `tick`, so no per-operation timer is armed on the hot path.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Iterable, Mapping
from ipaddress import IPv4Address, IPv6Address
from typing import cast

from ..config import ClientSpec, Settings, resolve_pins
from ..policy.addrs import AddressGuard
from ..policy.rules import Policy
from ..policy.target import IPAddress, join_host_port
from ..validate import as_bool, as_callables, as_choice, as_instance, as_list, as_str_list
from .context import ProxyContext
from .core.clients import ClientTable, Identity
from .core.gate import Gate, SniMissing
from .endpoints import ListenerControl
from .fdbudget import pool_max_idle
from .heap import Heap
from .intake import Intake
from .net.conn import Conn, Limits
from .net.listener import Listener, ListenerKind, ListenError, parse_listen
from .net.pool import UpstreamPool
from .net.resolve import Resolver
from .runtime import AuditSink, Steps
from .sweeper import Sweeper
from .telemetry.insight import ADMIN_MAX_CONNECTIONS, Operations, check_admin_address
from .telemetry.metrics import ProxyMetrics
from .telemetry.observe import DecisionCallback, ExecutionSummary, Observers
from .tenants import ClientControl


def _check_arguments(
    policy: object,
    audit: object,
    limits: object,
    sni_missing: object,
    flags: Mapping[str, object],
) -> None:
    """`EgressProxy`'s typed arguments (docs/policy.md#types): a wrong one is a TypeError or
    ValueError naming it, before anything is opened."""
    as_instance(policy, "EgressProxy policy", (Policy, Settings), "a Policy or Settings")
    if audit is not None and not callable(getattr(audit, "record", None)):
        raise TypeError(f"EgressProxy audit must be an AuditLog (or None), not {audit!r}")
    as_instance(limits or Limits(), "EgressProxy limits", Limits, "a Limits")
    as_choice(sni_missing, "EgressProxy sni_missing", ("if-named", "allow", "deny"))
    # real booleans: require_auth="false" or reuse_port="false" must not read as true
    for flag, value in flags.items():
        as_bool(value, f"EgressProxy {flag}")


def _settings(
    policy: Policy | Settings, resolve: Mapping[str, str | Iterable[str]] | None
) -> Settings:
    """The configuration the proxy starts with: `policy`'s, with `resolve`'s pins over its own
    for the same names."""
    settings = policy if isinstance(policy, Settings) else Settings(policy=policy)
    if resolve is None:
        return settings
    return dataclasses.replace(settings, resolve={**settings.resolve, **resolve_pins(resolve)})


def _host_local(host_local: Iterable[IPAddress] | None) -> frozenset[IPAddress] | None:
    """The host's own addresses as the caller fixed them (None: read from the interfaces)."""
    if host_local is None:
        return None
    kinds = (IPv4Address, IPv6Address)
    checked = as_list(host_local, "EgressProxy host_local", kinds, "addresses")
    return frozenset(cast("list[IPAddress]", checked))


class EgressProxy:
    """An embeddable egress proxy sharing the caller's event loop.

    ::

        async with EgressProxy(policy, listen=["127.0.0.1:0"], audit=log) as proxy:
            env = {"HTTPS_PROXY": proxy.url}

    `policy` is a `Policy` or full `Settings` (guard, `--resolve` pins, per-client policies).
    `resolve` pins names to addresses (`{"api.test": "198.18.0.2"}`, or a list of addresses
    per name), as `egress serve --resolve` does (docs/proxy.md#resolution-and---resolve); a
    name pinned here replaces the same name's pins in `Settings`. A bad name or address is
    a `PolicyError`.
    `listen_netns` opens every listening socket inside that network namespace (a name under
    /run/netns, a path, or a PID) while serving it from this loop. `host_local` overrides the
    discovered host addresses (None = read them from this namespace's interfaces).

    Raises `OSError` from `start()` when a listener cannot be bound, `NamespaceError` when the
    namespace cannot be entered.

    `tune_gc` (default True) tunes this process's garbage collector so that hundreds of
    sandboxes cause no long pauses: thresholds raised, long-lived objects frozen after
    start-up and after each prepare burst (docs/proxy.md#garbage-collection). False
    leaves the collector alone.
    """

    # set by start(): plain attributes, not properties, because the hot path reads them
    loop: asyncio.AbstractEventLoop
    pool: UpstreamPool
    steps: Steps
    # `http://HOST:PORT` of the first listener (what HTTP(S)_PROXY should hold), once bound
    url: str

    def __init__(
        self,
        policy: Policy | Settings,
        *,
        listen: Iterable[str] = ("127.0.0.1:0",),
        socks: Iterable[str] = (),
        listen_netns: str | None = None,
        audit: AuditSink | None = None,
        limits: Limits | None = None,
        require_auth: bool = False,
        sni_missing: SniMissing = "if-named",
        host_local: Iterable[IPAddress] | None = None,
        resolver: Resolver | None = None,
        admin: str | None = None,
        metrics: bool = True,
        on_decision: DecisionCallback | Iterable[DecisionCallback] | None = None,
        reuse_port: bool = False,
        resolve: Mapping[str, str | Iterable[str]] | None = None,
        admin_public: bool = False,
        tune_gc: bool = True,
    ) -> None:
        flags = {
            "require_auth": require_auth,
            "metrics": metrics,
            "reuse_port": reuse_port,
            "admin_public": admin_public,
            "tune_gc": tune_gc,
        }
        _check_arguments(policy, audit, limits, sni_missing, flags)
        fixed_host_local = _host_local(host_local)
        if resolver is not None:
            as_instance(resolver, "EgressProxy resolver", Resolver, "a Resolver")
        settings = _settings(policy, resolve)
        self.gate = Gate(
            ClientTable(settings, require_auth=require_auth), settings.guard, sni_missing
        )
        self.audit = audit
        # what the proxy's parts share; each component is handed it, never this proxy
        self.context = context = ProxyContext(
            settings, self.gate, resolver or Resolver(settings.resolve), audit
        )
        self.addresses = context.addresses
        self.listeners = context.listeners
        self._conns = context.conns
        # its components, each one concept (composition, not mixins)
        self.tenants = ClientControl(
            context,
            own_resolver=resolver is not None,
            host_local=fixed_host_local,
            listen_netns=listen_netns,
        )
        self.intake = Intake(context)
        self.endpoints = ListenerControl(
            context, self.intake.take, self.intake.refuse_exhausted, reuse_port=reuse_port
        )
        self.listen_specs = [parse_listen(s) for s in as_str_list(listen, "EgressProxy listen")]
        self.socks_specs = [parse_listen(s) for s in as_str_list(socks, "EgressProxy socks")]
        self.socks_addresses: list[tuple[str, int]] = []
        self.listen_netns = listen_netns
        self.reuse_port = reuse_port  # share listen ports with other workers (serve --workers)
        self.limits = limits or Limits()
        self.sni_missing: SniMissing = sni_missing
        self.sweeper: Sweeper | None = None
        self._started = False
        self.closing = False
        # callbacks given every audit event as written (the sandbox lifecycle's too); they see
        # the event before the audit log's redaction, so treat it as sensitive
        self.hooks: list[Callable[[dict[str, object]], object]] = []
        # docs/metrics.md: metrics, summaries and callbacks see the audit log's records
        self._metrics = ProxyMetrics(lambda: len(self._conns)) if metrics else None
        callbacks = as_callables(on_decision, "EgressProxy on_decision")
        self.observers = Observers(self._metrics, callbacks)
        self.insight = Operations(self._metrics, self.observers)
        self.admin_spec = None if admin is None else parse_listen(admin, "admin")
        if self.admin_spec is not None:
            check_admin_address(self.admin_spec[0], admin_public, "EgressProxy admin")
        self.heap = Heap(tune_gc)  # docs/proxy.md#garbage-collection

    # -- the public API of its components (composition: docs/architecture.md) ------------

    @property
    def settings(self) -> Settings:
        """The configuration in force (`replace_settings` and the client calls change it)."""
        return self.context.settings

    @property
    def resolver(self) -> Resolver:
        """The resolver of the pins in force (a reload makes a new one, unless it was given)."""
        return self.context.resolver

    @property
    def clients(self) -> ClientTable:
        return self.tenants.clients

    @property
    def guard(self) -> AddressGuard:
        """The address guard in force (the host's own addresses included)."""
        return self.tenants.guard

    def add_client(self, spec: ClientSpec) -> Identity:
        """Serve a client (sandbox) with its own policy, or replace the client of the same
        id atomically (its old token and sources stop matching in the same step); takes
        effect at once. Raises `ClientError` if the token or sources belong to another client.
        """
        return self.tenants.add_client(spec)

    def remove_client(self, client_id: str) -> ClientSpec | None:
        """Forget a client: its token and source addresses identify nobody any more."""
        return self.tenants.remove_client(client_id)

    def set_client_policy(self, client_id: str, policy: Policy, *, source: str = "api") -> None:
        """Replace one client's policy, atomically: every request identified from now on
        (the next request on a kept-alive connection too) is judged by `policy`, and its open
        tunnels are judged again (`revoke_tunnels`). Also re-binds listeners bound to
        that client (a sandbox's own listener). Raises KeyError for an unknown client."""
        return self.tenants.set_client_policy(client_id, policy, source=source)

    async def replace_settings(self, settings: Settings, *, source: str = "api") -> None:
        """Swap the whole configuration (top-level policy, guard, pins, clients) at once, as
        `egress serve` does on SIGHUP. Listeners bound to a client that the new settings
        name get its new policy; other bound listeners keep theirs. Networks the proxy
        reserved for its sandboxes (fake-IP pools, `reserve`) stay reserved."""
        return await self.tenants.replace_settings(settings, source=source)

    def revoke_tunnels(self, policies: Mapping[str | None, Policy]) -> int:
        """Re-judge what the clients in `policies` have open under their new policy, with
        the address it was dialed at (`core/revocation.py`), and close what it no longer
        allows (docs/policy.md#live-policy-changes): a tunnel (CONNECT, SOCKS5,
        transparent) or a plain-HTTP request in flight is cut, its own record `end:
        revoked`; a kept-alive client connection between requests and an idle pooled
        upstream connection whose last request went there are closed, one connection
        record `end: revoked` for each such last request. Framework-route forwarders are
        not client policy and stay. Returns how many connections it closed."""
        return self.tenants.revoke_tunnels(policies)

    def reserve(self, network: str) -> None:
        """Refuse `network` from now on, like a `--reserve` CIDR (a fake-IP pool must never
        be dialed: docs/proxy.md#transparent-mode-and-socks5)."""
        return self.tenants.reserve(network)

    async def refresh_host_local(self) -> None:
        """Re-read this host's interface addresses into the guard (also done periodically)."""
        return await self.tenants.refresh_host_local()

    async def add_listener(
        self,
        listen: str,
        *,
        netns: str | None = None,
        client: ClientSpec | None = None,
        kind: ListenerKind = "http",
    ) -> Listener:
        """Listen on `HOST:PORT` (inside `netns` if given) while running.

        With `client`, every connection on this listener is that client (its policy and
        id), whatever credentials it presents: a listener on a sandbox's own loopback can
        only be reached from inside that sandbox. `kind` says what it speaks: the HTTP
        proxy, SOCKS5, or transparent redirects (a `transparent` listener requires `client`;
        docs/proxy.md#transparent-mode-and-socks5). Raises OSError / NamespaceError.
        """
        listener = await self.endpoints.add_listener(listen, netns=netns, client=client, kind=kind)
        if client is not None:
            self.tenants.policy_applied(client.client_id, client.policy, "listener")
        return listener

    async def add_forwarder(
        self, listen: str, route: str, *, netns: str | None = None, client_id: str | None = None
    ) -> Listener:
        """A plain TCP forwarder from `HOST:PORT` (in `netns`) to framework route `route`.

        Lets a sandbox reach a framework service on the host's loopback at an address of its
        own (its loopback, or its gateway) without any proxy setting. Every connection is
        audited (method `FORWARD`, reason `framework_route`).
        """
        return await self.endpoints.add_forwarder(listen, route, netns=netns, client_id=client_id)

    async def remove_listeners(self, netns: str) -> None:
        """Stop every listener opened inside `netns` (a sandbox being released)."""
        return await self.endpoints.remove_listeners(netns)

    def remove_listener(self, listener: Listener) -> bool:
        """Stop `listener` and close the connections it accepted (a released sandbox keeps
        nothing open). Idempotent; False if it was not one of ours."""
        return self.endpoints.remove_listener(listener)

    def metrics(self) -> dict[str, object]:
        """The proxy's counters, gauges and histograms as plain data (docs/metrics.md).

        Raises RuntimeError when the proxy was built with `metrics=False`."""
        return self.insight.metrics()

    @property
    def admin_url(self) -> str | None:
        """`http://HOST:PORT` of the admin listener, once started (else None)."""
        return self.insight.admin_url

    def track_execution(self, client_id: str) -> ExecutionSummary:
        """Count `client_id`'s access records from now on (`prepare_execution` does this)."""
        return self.insight.track_execution(client_id)

    def execution_summary(self, client_id: str, *, stop: bool = False) -> ExecutionSummary:
        """Counts by decision, host and reason of `client_id`'s records since tracking began
        (`stop` ends the tracking; `release_execution` does this)."""
        return self.insight.execution_summary(client_id, stop=stop)

    def proxy_url(self, token: str | None = None, client_id: str = "agent") -> str:
        """The proxy URL, with `client_id:token@` userinfo when a token is given."""
        if token is None:
            return self.url
        return self.url.replace("http://", f"http://{client_id}:{token}@", 1)

    # --- lifecycle: its parts started in order, stopped in order -------------------------
    async def __aenter__(self) -> EgressProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Open the listeners and serve: raises `ListenError` (an `OSError`) naming the
        listener that cannot be bound, `NamespaceError` when `listen_netns` cannot be entered."""
        self.loop = loop = asyncio.get_running_loop()
        self._started = True
        admin = ADMIN_MAX_CONNECTIONS if self.admin_spec is not None else 0
        self.limits = lim = self.endpoints.fit_descriptors(self.limits, admin)
        self.pool = UpstreamPool(
            loop,
            idle=lim.pool_idle,
            per_key=lim.pool_per_key,
            max_idle=pool_max_idle(lim.max_connections),
        )
        self.steps = Steps(
            loop,
            self.gate,
            self.pool,
            self.context.resolver,
            self.audit,
            lim,
            hooks=self.hooks,
            observe=self.observers.record,
            metrics=self._metrics,
        )
        self.context.loop, self.context.steps, self.context.pool = loop, self.steps, self.pool
        self.intake.started(loop, self.steps, lim)
        netns, open_as = self.listen_netns, self.endpoints.open_as
        for host, port in self.listen_specs:
            self.addresses.append((await open_as("proxy", Listener(host, port, netns))).address)
        if self.addresses:  # what HTTP(S)_PROXY should hold
            self.url = "http://" + join_host_port(*self.addresses[0])
        for host, port in self.socks_specs:
            listener = Listener(host, port, netns, kind="socks5")
            self.socks_addresses.append((await open_as("socks5", listener)).address)
        await self.refresh_host_local()
        self.sweeper = Sweeper(self._conns, self.steps, self.pool, lim, self.refresh_host_local)
        self.sweeper.start(loop)
        settings = self.context.settings
        self.tenants.policy_applied(None, settings.policy, "start")
        for spec in settings.clients:
            self.tenants.policy_applied(spec.client_id, spec.policy, "start")
        if self.admin_spec is not None:
            try:
                await self.insight.start_admin(*self.admin_spec, self.intake.ready)
            except OSError as exc:
                raise ListenError("admin", join_host_port(*self.admin_spec), exc) from exc
        self.heap.started(loop)

    async def stop(self) -> None:
        """Stop accepting, give open connections `shutdown_grace` seconds, then close them."""
        if self.closing:
            return
        self.closing = True
        if self._started:
            self.steps.closing = self.pool.closing = True
        for listener in self.listeners:
            listener.close()
        await self.intake.drain(self.limits.shutdown_grace)
        if self.sweeper is not None:
            await self.sweeper.stop()
        if self._started:
            self.pool.close()
            self.steps.flush_refusals(everything=True)
        self.context.resolver.close()
        await self.insight.stop_admin()
        self.endpoints.reserve.close()
        self.heap.stopped()


__all__ = ["AuditSink", "Conn", "EgressProxy", "Limits", "Listener", "parse_listen"]

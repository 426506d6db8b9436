"""`EgressProxy`: the asyncio forward proxy (CONNECT tunnels and absolute-form HTTP).

Shell, and thin: lifecycle, accepting connections and the sweeper; it owns three components,
one concept each, and delegates the rest of its public API to them: `tenants`
(`ClientControl`, `tenants.py`: clients and live policy), `endpoints` (`ListenerControl`,
`endpoints.py`: listeners of every kind) and `insight` (`Operations`,
`telemetry/insight.py`: metrics, admin listener, execution summaries). What they share (the
configuration in force, the listeners, the open connections) is one `ProxyContext`
(`context.py`) that each is handed: none holds the proxy, none imports this module. Refusals
are answered and audit records written in one place, `runtime.py`. Each client connection
runs one coroutine: *read head -> gate -> resolve -> gate -> dial -> relay -> record*. Every
decision is the pure gate's (`gate.py`: identity, verdicts, SNI, keep-alive after a refusal,
1xx/101); the exchanges are `modes/http/serve.py` (absolute-form HTTP on the upstream
`pool.py`), `modes/connect/serve.py` and `modes/forwarder/serve.py` (tunnels and
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
import contextlib
import dataclasses
import functools
import logging
import os
import resource
import socket
import struct
from collections.abc import Callable, Coroutine, Iterable, Mapping
from ipaddress import IPv4Address, IPv6Address
from typing import Any, Final, cast

from ..config import ClientSpec, Settings, resolve_pins
from ..errors import ProtocolError
from ..policy.addrs import AddressGuard
from ..policy.rules import Policy
from ..policy.target import IPAddress, join_host_port
from ..reasons import End, Reason
from ..validate import as_bool, as_callables, as_choice, as_instance, as_list, as_str_list
from .admission import CLIENT_FULL
from .context import ProxyContext
from .core.clients import ClientTable, Identity
from .core.gate import HEAD_TIMEOUT, Gate, Refuse, SniMissing, admit_connection, refuse_head
from .core.responses import error_response
from .endpoints import ClientSide, ListenerControl
from .fdbudget import plan_fds, pool_max_idle
from .heap import Heap
from .modes.connect.serve import serve_tunnel
from .modes.forwarder.serve import serve_forwarder
from .modes.http.serve import serve_request
from .modes.kinds import PROXY, REDIRECTED, RESOLVER, ROUTE, SOCKS, ListenerMode
from .net.accept import PAUSE, Lingering
from .net.conn import Conn, Limits, read_head, sweep
from .net.listener import BACKLOG, Listener, ListenerKind, ListenError, parse_listen, peer_text
from .net.pool import UpstreamPool
from .net.resolve import Resolver
from .net.stepped import adopt
from .runtime import AuditSink, Steps
from .telemetry.insight import ADMIN_MAX_CONNECTIONS, Operations, check_admin_address
from .telemetry.metrics import ProxyMetrics
from .telemetry.observe import DecisionCallback, ExecutionSummary, Observers
from .tenants import ClientControl

log = logging.getLogger("egress")


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
        self.endpoints = ListenerControl(
            context, self._take, self._refuse_exhausted, reuse_port=reuse_port
        )
        self.listen_specs = [parse_listen(s) for s in as_str_list(listen, "EgressProxy listen")]
        self.socks_specs = [parse_listen(s) for s in as_str_list(socks, "EgressProxy socks")]
        self.socks_addresses: list[tuple[str, int]] = []
        self.listen_netns = listen_netns
        self.reuse_port = reuse_port  # share listen ports with other workers (serve --workers)
        self.limits = limits or Limits()
        self.sni_missing: SniMissing = sni_missing
        self._sweeper: asyncio.Task[None] | None = None
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
        self.fd_note: str | None = None  # what the descriptor budget changed, if anything
        self._lingering: Any = None  # accept.Lingering, once the loop is known
        self.heap = Heap(tune_gc)  # docs/proxy.md#garbage-collection

    # --- lifecycle ------------------------------------------------------------------------
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

    def ready(self) -> tuple[bool, str]:
        """(ready, why) for /readyz: listening, not stopping, and the audit log accepting."""
        if self.closing:
            return False, "stopping"
        if not self.listeners:
            return False, "not listening"
        if self.audit is not None and not self.audit.accepting:
            return False, "audit log not accepting"
        return True, "ready"

    def track_execution(self, client_id: str) -> ExecutionSummary:
        """Count `client_id`'s access records from now on (`prepare_execution` does this)."""
        return self.insight.track_execution(client_id)

    def execution_summary(self, client_id: str, *, stop: bool = False) -> ExecutionSummary:
        """Counts by decision, host and reason of `client_id`'s records since tracking began
        (`stop` ends the tracking; `release_execution` does this)."""
        return self.insight.execution_summary(client_id, stop=stop)

    async def __aenter__(self) -> EgressProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def url(self) -> str:
        """`http://HOST:PORT` of the first listener (what HTTP(S)_PROXY should hold)."""
        return "http://" + join_host_port(*self.addresses[0])

    def proxy_url(self, token: str | None = None, client_id: str = "agent") -> str:
        """The proxy URL, with `client_id:token@` userinfo when a token is given."""
        if token is None:
            return self.url
        return self.url.replace("http://", f"http://{client_id}:{token}@", 1)

    async def start(self) -> None:
        self.loop = loop = asyncio.get_running_loop()
        self._started = True
        lim = self.limits
        self._fit_descriptors()
        self._lingering = Lingering(loop)
        lim = self.limits
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
        for host, port in self.listen_specs:
            listener = await self._open_as("proxy", Listener(host, port, self.listen_netns))
            self.addresses.append(listener.address)
        for host, port in self.socks_specs:
            listener = Listener(host, port, self.listen_netns, kind="socks5")
            self.socks_addresses.append((await self._open_as("socks5", listener)).address)
        await self.refresh_host_local()
        self._sweeper = loop.create_task(self._sweep(), name="egress-sweeper")
        settings = self.context.settings
        self.tenants.policy_applied(None, settings.policy, "start")
        for spec in settings.clients:
            self.tenants.policy_applied(spec.client_id, spec.policy, "start")
        if self.admin_spec is not None:
            try:
                await self.insight.start_admin(*self.admin_spec, self.ready)
            except OSError as exc:
                raise ListenError("admin", join_host_port(*self.admin_spec), exc) from exc
        self.heap.started(loop)

    async def _open_as(self, role: str, listener: Listener) -> Listener:
        """Open a listener of `start`; `ListenError` names which one failed."""
        try:
            return await self.endpoints.open(listener)
        except OSError as exc:
            if isinstance(exc, ListenError):
                raise
            raise ListenError(role, join_host_port(listener.host, listener.port), exc) from exc

    async def stop(self) -> None:
        """Stop accepting, give open connections `shutdown_grace` seconds, then close them."""
        if self.closing:
            return
        self.closing = True
        if self._started:
            self.steps.closing = self.pool.closing = True
        for listener in self.listeners:
            listener.close()
        tasks: list[asyncio.Future[None]] = []
        for conn in self._conns:
            if conn.task is not None:
                tasks.append(conn.task)
            else:  # served from callbacks (`drive/callback.py`): done when `_finished`
                tasks.append(conn.stop_waits(self.loop.create_future()))
        for conn in list(self._conns):
            if conn.phase != "active":
                conn.cut_by(End.SHUTDOWN)
                conn.side.close()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=self.limits.shutdown_grace)
            for conn in list(self._conns):
                conn.cut_by(End.SHUTDOWN)
                conn.side.abort()
                if conn.upstream is not None:
                    conn.upstream.abort()
                if conn.dialing is not None:
                    conn.dialing.cancel()
            if pending:
                await asyncio.wait(pending, timeout=1.0)
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        if self._started:
            self.pool.close()
            self.steps.flush_refusals(everything=True)
        self.context.resolver.close()
        await self.insight.stop_admin()
        self.endpoints.reserve.close()
        self.heap.stopped()

    # --- descriptors (docs/proxy.md#file-descriptors) ---------------------------------------
    def _fit_descriptors(self) -> None:
        """Make `max_connections` fit RLIMIT_NOFILE: raise the soft limit when it is lower
        than the cap needs, else lower the cap and say so (the listen backlog keeps its length)."""
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        top = None if hard == resource.RLIM_INFINITY else hard
        admin = ADMIN_MAX_CONNECTIONS if self.admin_spec is not None else 0
        try:
            in_use = len(os.listdir("/proc/self/fd"))
        except OSError:
            in_use = 0
        cap = self.limits.max_connections
        plan = plan_fds(cap, BACKLOG, admin + in_use, soft, top)
        if plan.soft != soft:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (plan.soft, hard))
            except (ValueError, OSError):
                plan = plan_fds(cap, BACKLOG, admin + in_use, soft, soft)
        if plan.max_connections != cap:
            self.limits = dataclasses.replace(self.limits, max_connections=plan.max_connections)
        self.endpoints.backlog = plan.backlog
        self.fd_note = plan.note
        if plan.note is not None:
            log.warning("egress: %s", plan.note)

    # --- the sweeper: timeouts without per-operation timers --------------------------------
    async def _sweep(self) -> None:
        lim = self.limits
        steps = self.steps
        lifecycle = steps.lifecycle
        interim = lifecycle.interim_interval if lifecycle is not None else lim.idle_timeout
        shortest = min(lim.head_timeout, lim.idle_timeout, lim.connect_timeout, interim)
        tick = max(0.05, min(1.0, shortest / 4))
        refresh_every = 30.0
        next_refresh = self.loop.time() + refresh_every
        while True:
            await asyncio.sleep(tick)
            now = self.loop.time()
            for conn in list(self._conns):
                sweep(conn, now, lim)
                if conn.rec is not None:  # docs/audit-log.md#open-and-progress
                    steps.progress(conn, now)
            self.steps.overdue(now)
            self.steps.turns.expire(now)
            self.steps.flush_refusals()
            self.pool.sweep(now)
            if now >= next_refresh:
                next_refresh = now + refresh_every
                with contextlib.suppress(Exception):
                    await self.refresh_host_local()

    # --- per connection ---------------------------------------------------------------------
    def _take(self, listener: Listener, sock: socket.socket, addr: object) -> None:
        """A new connection: admitted (counted for its client from now on, admission.py)
        and served, or refused at once, before it costs a transport or a task
        (docs/proxy.md#limits). The socket is made non-blocking where it is used: by the loop
        when it becomes a transport (so a tunnel's accept costs no `ioctl` of ours), and
        before a refusal is written to it."""
        steps = self.steps
        audit_ok = self.audit is None or self.audit.accepting
        if audit_ok and not self.closing:
            early = steps.refuse_at_accept(listener, addr)
            if early is not None:  # its client is at its cap: a flood costs only this
                self._close_refused(listener, sock, *early)
                return
        side = ClientSide(self.loop, self.limits.max_head, listener)
        conn = Conn(side, peer_text(addr), addr, listener, phase_since=self.loop.time())
        refusal = admit_connection(
            steps.slots.total, self.limits.max_connections, closing=self.closing, audit_ok=audit_ok
        ) or steps.admit(conn)
        if refusal is not None:
            self._refuse_socket(conn, sock, refusal)
            if refusal is CLIENT_FULL and listener.identity is not None and listener.acceptor:
                listener.acceptor.hold(PAUSE)  # its own listener: only refusals to accept
            return
        self._conns.add(conn)
        if listener.mode.fast_path:
            # the forward proxy's kept-alive requests may take the callback fast path; a
            # transparent, SOCKS5 or forwarder connection never does (docs/architecture.md)
            side.conn, side.steps = conn, steps
            if steps.fast_path:
                # no task yet: its first head decides (a CONNECT is served from callbacks,
                # anything else starts the coroutine: `drive.callback.FastClient.first_head`)
                side.spawn, side.finish = self._spawn, self._finished
                adopt(self.loop, sock, side, lambda _, err: self._adopted(conn, sock, err))
                return
        sock.setblocking(False)
        conn.run_by(self.loop.create_task(self._serve(conn, sock)))

    def _adopted(self, conn: Conn, sock: socket.socket, err: BaseException | None) -> None:
        """A connection's transport is made (or failed): closed at once if it was evicted,
        or the proxy began stopping, meanwhile (as `_serve` does)."""
        if err is not None:  # no transport: nothing will call back
            side = conn.side
            if isinstance(side, ClientSide):
                side.spawn = None
            sock.close()
            self._finished(conn)
        elif conn.end is not None or self.closing:
            conn.side.close()

    def _spawn(self, conn: Conn, work: Coroutine[Any, Any, None] | None) -> None:
        """Start the coroutine of a connection accepted without one: it serves from the
        buffered head on (None), or carries on an exchange the callback driver began."""
        coro = self._serve(conn, None) if work is None else self._carry_on(conn, work)
        conn.run_by(self.loop.create_task(coro))

    async def _carry_on(self, conn: Conn, work: Coroutine[Any, Any, None]) -> None:
        try:
            await work
        except Exception:  # a bug must never take the proxy down
            log.exception("egress: unexpected error serving %s", conn.client)
        finally:
            self._finished(conn)

    def _finished(self, conn: Conn) -> None:
        """A connection ended (its coroutine, or the callback driver): its record if the
        proxy closed it before any exchange, its slot freed, both sides closed."""
        if conn not in self._conns:
            return
        self._conns.discard(conn)
        self.steps.record_closed(conn)
        self.steps.release(conn)
        side = conn.side
        side.close()
        if isinstance(side, ClientSide):
            # `conn.side` and `side.conn` were a cycle: every closed connection left a dozen
            # objects for the collector, and froze them if a settle came first
            # (docs/proxy.md#garbage-collection)
            side.conn = None
        if conn.upstream is not None:
            conn.upstream.close()
        if conn.ended is not None and not conn.ended.done():
            conn.ended.set_result(None)

    def _close_refused(
        self, listener: Listener, sock: socket.socket, refusal: Refuse, in_full: bool
    ) -> None:
        """A connection refused at accept (already recorded): answered and closed like
        `_refuse_socket`, or, past a flood's first refusals in a second, reset at once
        (`tally.answer_in_full`, docs/audit-log.md#aggregated-refusals)."""
        sock.setblocking(False)
        if not in_full:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
            sock.close()
        elif listener.mode.answers_at_accept:
            with contextlib.suppress(OSError):
                sock.send(_answer(refusal))
            self._lingering.close(sock)
        else:
            sock.close()
        if listener.identity is not None and listener.acceptor is not None:
            listener.acceptor.hold(PAUSE)  # its own listener: only refusals to accept

    def _refuse_exhausted(self, listener: Listener, sock: socket.socket, addr: object) -> None:
        """A connection accepted with the reserved descriptor: answered 503, recorded."""
        side = ClientSide(self.loop, self.limits.max_head, listener)
        conn = Conn(side, peer_text(addr), addr, listener)
        self._refuse_socket(conn, sock, OUT_OF_DESCRIPTORS)

    def _refuse_socket(self, conn: Conn, sock: socket.socket, refusal: Refuse) -> None:
        """Answer (HTTP) or just close (SOCKS5, DNS, transparent: no protocol to answer in)
        straight on the socket, and record it."""
        sock.setblocking(False)
        if conn.listener.mode.answers_at_accept:
            _, data = error_response(refusal.reason, refusal.detail, status=refusal.status)
            with contextlib.suppress(OSError):
                sock.send(data)
            self._lingering.close(sock)
        else:
            sock.close()
        self.steps.refuse_now(conn, refusal, write=False)
        self.steps.release(conn)

    async def _serve(self, conn: Conn, sock: socket.socket | None) -> None:
        """Serve a connection from its first head (`sock`: its transport is still to make)."""
        try:
            if sock is not None:
                try:
                    await self.loop.connect_accepted_socket(lambda: conn.side, sock)
                except OSError:
                    sock.close()
                    return
                if conn.end is not None or self.closing:  # evicted, or stopping, meanwhile
                    return
            listener = conn.listener
            mode = listener.mode
            if mode is ROUTE and listener.forward_to is not None:
                await serve_forwarder(self.steps, conn, listener.forward_to)
                return
            if mode is not PROXY:
                await _serve_other(self.steps, conn, mode)
                return
            while await self._one_request(conn):
                pass
        except Exception:  # a bug must never take the proxy down
            log.exception("egress: unexpected error serving %s", conn.client)
        finally:
            self._finished(conn)

    async def _one_request(self, conn: Conn) -> bool:
        """Serve one request; True if the client connection stays open for another."""
        try:
            head = await read_head(conn, self.limits, self.loop)
        except ProtocolError as exc:
            if conn.end == End.REVOKED.value:  # closed by a policy change, recorded
                return False
            if conn.end == End.HEAD_TIMEOUT.value:  # the sweeper already answered 408
                self.steps.refuse_now(conn, HEAD_TIMEOUT, write=False)
            else:
                self.steps.refuse_now(conn, refuse_head(exc))
            return False
        if head is None or (conn.end is not None and conn.end == End.REVOKED.value):
            # a head that arrived as a policy change closed its connection between requests
            # (docs/policy.md#live-policy-changes): the client saw the close, not an answer
            return False
        conn.serving()
        if head.method == "CONNECT":
            # the last request's record is not what it opens, nor an earlier change's recheck
            conn.exchange_begins()
            await serve_tunnel(self.steps, conn, head)
            return False
        keep = await serve_request(self.steps, conn, head)
        conn.request_ended(self.loop.time())
        return keep


_RESET: Final = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close sends a reset


@functools.cache
def _answer(refusal: Refuse) -> bytes:
    """The bytes of a refusal's answer at accept (the same few refusals, over and over)."""
    return error_response(refusal.reason, refusal.detail, status=refusal.status)[1]


OUT_OF_DESCRIPTORS: Final = Refuse(
    Reason.TOO_MANY_CONNECTIONS,
    "out of file descriptors (docs/proxy.md#file-descriptors)",
)


async def _serve_other(steps: Steps, conn: Conn, mode: ListenerMode) -> None:
    """A SOCKS5, DNS or transparent connection (docs/proxy.md#transparent-mode-and-socks5),
    by its listener's mode; imported on first use: a proxy that never opens such a listener
    never loads them (the DNS codec is dnspython)."""
    if mode is SOCKS:
        from .modes.socks5.serve import serve_socks

        await serve_socks(steps, conn)
    elif mode is RESOLVER:
        from .modes.dns.serve import serve_dns_tcp

        await serve_dns_tcp(steps, conn)
    elif mode is REDIRECTED:
        from .modes.transparent.serve import serve_transparent

        await serve_transparent(steps, conn)
    else:
        raise RuntimeError(f"unexpected listener mode {mode.name!r}")


__all__ = ["AuditSink", "Conn", "EgressProxy", "Limits", "Listener", "parse_listen"]

"""`EgressProxy`: the asyncio forward proxy (CONNECT tunnels and absolute-form HTTP).

Shell, and thin: lifecycle, listeners, accepting connections, the sweeper, and the one place
that answers refusals and writes audit records. Each client connection runs one coroutine:
*read head -> gate -> resolve -> gate -> dial -> relay -> record*. Every decision is the pure
gate's (`gate.py`: identity, verdicts, SNI, keep-alive after a refusal, 1xx/101); the
exchanges are `forward.py` (absolute-form HTTP on the upstream `pool.py`) and `tunnel.py`
(CONNECT and framework-route forwarders). See docs/architecture.md.

Every request on a kept-alive client connection is parsed, identified and judged afresh; an
upstream connection is reused only for the *checked* address and port, so reuse never skips
a decision. Names are resolved once per decision and only checked addresses are dialed.

DoS bounds (defaults in `Limits`, docs/proxy.md#limits): head size and field count (`wire`),
head read timeout, connect timeout, idle timeout, maximum concurrent client connections and a
per-client share of them (503 beyond; idle kept-alive connections are reclaimed first),
per-transport write buffers (`relay.WRITE_HIGH_WATER`). A sweeper task enforces the timeouts
once per `tick`, so no per-operation timer is armed on the hot path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from typing import Any

from ..config import ClientSpec, Settings
from ..errors import ProtocolError
from ..policy.addrs import AddressGuard
from ..policy.rules import Policy
from ..policy.target import IPAddress, join_host_port, parse_ip_literal
from ..reasons import End
from ..validate import as_choice, as_instance, as_str_list
from .clients import ClientTable, Identity
from .conn import Conn, Limits, read_head, reclaim_idle, sweep
from .fast import FastClient
from .forward import serve_request
from .gate import (
    HEAD_TIMEOUT,
    Gate,
    SniMissing,
    admit_connection,
    refuse_head,
)
from .hostaddrs import local_addresses_async
from .listener import BACKLOG, Listener, ListenerKind, listen_socket, parse_listen
from .metrics import ProxyMetrics
from .netns import listen_in_netns
from .observe import DecisionCallback, ExecutionSummary, Observers
from .pool import UpstreamPool
from .resolve import Resolver
from .steps import AuditSink, Steps
from .tunnel import serve_forwarder, serve_tunnel

log = logging.getLogger("egress")


class EgressProxy:
    """An embeddable egress proxy sharing the caller's event loop.

    ::

        async with EgressProxy(policy, listen=["127.0.0.1:0"], audit=log) as proxy:
            env = {"HTTPS_PROXY": proxy.url}

    `policy` is a `Policy` or full `Settings` (guard, `--resolve` pins, per-client policies).
    `listen_netns` opens every listening socket inside that network namespace (a name under
    /run/netns, a path, or a PID) while serving it from this loop. `host_local` overrides the
    discovered host addresses (None = read them from this namespace's interfaces).

    Raises `OSError` from `start()` when a listener cannot be bound, `NamespaceError` when the
    namespace cannot be entered.
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
    ) -> None:
        as_instance(policy, "EgressProxy policy", (Policy, Settings), "a Policy or Settings")
        if audit is not None and not callable(getattr(audit, "record", None)):
            raise TypeError(f"EgressProxy audit must be an AuditLog (or None), not {audit!r}")
        as_instance(limits or Limits(), "EgressProxy limits", Limits, "a Limits")
        as_choice(sni_missing, "EgressProxy sni_missing", ("if-named", "allow", "deny"))
        self.settings = policy if isinstance(policy, Settings) else Settings(policy=policy)
        self.listen_specs = [parse_listen(s) for s in as_str_list(listen, "EgressProxy listen")]
        self.socks_specs = [parse_listen(s) for s in as_str_list(socks, "EgressProxy socks")]
        self.socks_addresses: list[tuple[str, int]] = []
        self.listen_netns = listen_netns
        self.reuse_port = reuse_port  # share listen ports with other workers (serve --workers)
        self.audit = audit
        self.limits = limits or Limits()
        self.sni_missing: SniMissing = sni_missing
        self.gate = Gate(
            ClientTable(self.settings, require_auth=require_auth), self.settings.guard, sni_missing
        )
        self.resolver = resolver or Resolver(self.settings.resolve)
        self._own_resolver = resolver is not None
        self._fixed_host_local = None if host_local is None else frozenset(host_local)
        self.addresses: list[tuple[str, int]] = []
        self.listeners: list[Listener] = []
        self._conns: set[Conn] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self._started = False
        self.closing = False
        # callbacks given every audit event as written (the sandbox lifecycle's too); they see
        # the event before the audit log's redaction, so treat it as sensitive
        self.hooks: list[Callable[[dict[str, object]], object]] = []
        # docs/metrics.md: metrics, summaries and callbacks see the audit log's records
        self._metrics = ProxyMetrics(lambda: len(self._conns)) if metrics else None
        callbacks = [on_decision] if callable(on_decision) else list(on_decision or ())
        self.observers = Observers(self._metrics, callbacks)
        self.admin_spec = None if admin is None else parse_listen(admin, "admin")
        self.admin: Any = None  # egress.proxy.admin.AdminServer once started

    # --- lifecycle ------------------------------------------------------------------------
    async def __aenter__(self) -> EgressProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def clients(self) -> ClientTable:
        return self.gate.clients

    @property
    def url(self) -> str:
        """`http://HOST:PORT` of the first listener (what HTTP(S)_PROXY should hold)."""
        return "http://" + join_host_port(*self.addresses[0])

    def proxy_url(self, token: str | None = None, client_id: str = "agent") -> str:
        """The proxy URL, with `client_id:token@` userinfo when a token is given."""
        if token is None:
            return self.url
        return self.url.replace("http://", f"http://{client_id}:{token}@", 1)

    def add_client(self, spec: ClientSpec) -> Identity:
        """Serve a client (sandbox) with its own policy, or replace the client of the same
        id atomically (its old token and sources stop matching in the same step); takes
        effect at once. Raises `ClientError` if the token or sources belong to another client.
        """
        identity = self.clients.put(spec)
        self._sync_settings()
        self._policy_applied(spec.client_id, spec.policy, "api")
        return identity

    def remove_client(self, client_id: str) -> ClientSpec | None:
        """Forget a client: its token and source addresses identify nobody any more."""
        spec = self.clients.remove(client_id)
        self._sync_settings()
        return spec

    def _sync_settings(self) -> None:
        s = self.settings
        specs = tuple(self.clients.spec(c) for c in self.clients.client_ids)
        self.settings = Settings(s.policy, s.guard, s.resolve, specs)  # type: ignore[arg-type]

    # --- live policy (docs/policy.md#live-policy-changes) -----------------------------------
    def set_client_policy(self, client_id: str, policy: Policy, *, source: str = "api") -> None:
        """Replace one client's policy, atomically: every request identified from now on
        (the next request on a kept-alive connection too) is judged by `policy`; requests
        and tunnels already decided keep their decision. Also re-binds listeners bound to
        that client (a sandbox's own listener). Raises KeyError for an unknown client."""
        known = self.clients.spec(client_id) is not None
        bound = [li for li in self.listeners if li.identity is not None
                 and li.identity.client_id == client_id and li.forward_to is None]
        if not known and not bound:
            raise KeyError(f"no client {client_id!r} on this proxy")
        if known:
            self.clients.replace(client_id, policy)
            self._sync_settings()
        for listener in bound:
            listener.identity = Identity(client_id, policy)
        self._policy_applied(client_id, policy, source)

    async def replace_settings(self, settings: Settings, *, source: str = "api") -> None:
        """Swap the whole configuration (top-level policy, guard, pins, clients) at once, as
        `egress serve` does on SIGHUP. Listeners bound to a client that the new settings
        name get its new policy; other bound listeners keep theirs."""
        self.settings = settings
        self.gate.clients = ClientTable(settings, require_auth=self.clients.require_auth)
        if not self._own_resolver:
            old, self.resolver = self.resolver, Resolver(settings.resolve)
            if self._started:
                self.steps.resolver = self.resolver
            old.close()
        by_id = {c.client_id: c.policy for c in settings.clients}
        for listener in self.listeners:
            ident = listener.identity
            if ident is not None and listener.forward_to is None and ident.client_id in by_id:
                listener.identity = Identity(ident.client_id, by_id[ident.client_id])
        await self.refresh_host_local()  # the guard from the new settings
        self._policy_applied(None, settings.policy, source)
        for spec in settings.clients:
            self._policy_applied(spec.client_id, spec.policy, source)

    def _policy_applied(self, client_id: str | None, policy: Policy, source: str) -> None:
        """Audit that `policy` starts applying to `client_id` (docs/audit-log.md)."""
        if self.audit is None or not self._started:
            return
        self.audit.record({"type": "policy", "client_id": client_id, "policy": policy.digest,
                           "source": source, "canonical": policy.canonical()})

    # --- operators: metrics, admin listener, executions (docs/metrics.md) ------------------
    def metrics(self) -> dict[str, object]:
        """The proxy's counters, gauges and histograms as plain data (docs/metrics.md).

        Raises RuntimeError when the proxy was built with `metrics=False`."""
        if self._metrics is None:
            raise RuntimeError("metrics are disabled (EgressProxy(metrics=False))")
        return self._metrics.snapshot()

    @property
    def admin_url(self) -> str | None:
        """`http://HOST:PORT` of the admin listener, once started (else None)."""
        from .admin import admin_url

        return None if self.admin is None else admin_url(self.admin.address)

    def ready(self) -> tuple[bool, str]:
        """(ready, why) for /readyz: listening, not stopping, and the audit log accepting."""
        if self.closing:
            return False, "stopping"
        if not self.listeners:
            return False, "not listening"
        if self.audit is not None and not self.audit.accepting:
            return False, "audit log not accepting"
        return True, "ready"

    async def _start_admin(self, host: str, port: int) -> None:
        from .admin import AdminServer

        if self._metrics is None:
            raise ValueError("the admin listener needs metrics (metrics=True)")
        self.admin = AdminServer(self._metrics, self.ready)
        await self.admin.start(host, port)

    def track_execution(self, client_id: str) -> ExecutionSummary:
        """Count `client_id`'s access records from now on (`prepare_execution` does this)."""
        return self.observers.track(client_id)

    def execution_summary(self, client_id: str, *, stop: bool = False) -> ExecutionSummary:
        """Counts by decision, host and reason of `client_id`'s records since tracking began
        (`stop` ends the tracking; `release_execution` does this)."""
        if stop:
            return self.observers.untrack(client_id)
        return self.observers.summaries.get(client_id) or ExecutionSummary(client_id)

    async def start(self) -> None:
        self.loop = loop = asyncio.get_running_loop()
        self._started = True
        lim = self.limits
        self.pool = UpstreamPool(
            loop, connect_timeout=lim.connect_timeout, idle=lim.pool_idle, per_key=lim.pool_per_key
        )
        self.steps = Steps(loop, self.gate, self.pool, self.resolver, self.audit, lim, self.hooks,
                           self.observers.record, self._metrics)
        self.pool.metrics = self._metrics
        for host, port in self.listen_specs:
            listener = await self._open_listener(Listener(host, port, self.listen_netns))
            self.addresses.append(listener.address)
        for host, port in self.socks_specs:
            listener = Listener(host, port, self.listen_netns, kind="socks5")
            self.socks_addresses.append((await self._open_listener(listener)).address)
        await self.refresh_host_local()
        self._sweeper = loop.create_task(self._sweep(), name="egress-sweeper")
        self._policy_applied(None, self.settings.policy, "start")
        for spec in self.settings.clients:
            self._policy_applied(spec.client_id, spec.policy, "start")
        if self.admin_spec is not None:
            await self._start_admin(*self.admin_spec)

    async def _open_listener(self, listener: Listener) -> Listener:
        if listener.netns:
            sock = listen_in_netns(listener.netns, listener.host, listener.port)
        else:
            sock = listen_socket(listener.host, listener.port, reuse_port=self.reuse_port)
        listener.server = await self.loop.create_server(
            lambda: _ClientSide(self, listener), sock=sock, backlog=BACKLOG
        )
        bound = sock.getsockname()
        listener.host, listener.port = str(bound[0]), int(bound[1])
        self.listeners.append(listener)
        return listener

    async def add_listener(
        self, listen: str, *, netns: str | None = None, client: ClientSpec | None = None,
        kind: ListenerKind = "http",
    ) -> Listener:
        """Listen on `HOST:PORT` (inside `netns` if given) while running.

        With `client`, every connection on this listener is that client (its policy and
        id), whatever credentials it presents: a listener on a sandbox's own loopback can
        only be reached from inside that sandbox. `kind` says what it speaks: the HTTP
        proxy, SOCKS5, or transparent redirects (a `transparent` listener requires `client`;
        docs/proxy.md#transparent-mode-and-socks5). Raises OSError / NamespaceError.
        """
        host, port = parse_listen(listen)
        identity = Identity(client.client_id, client.policy) if client is not None else None
        if kind == "transparent" and identity is None:
            raise ValueError("a transparent listener serves one sandbox: pass client=")
        listener = await self._open_listener(Listener(host, port, netns, identity, kind=kind))
        if client is not None:
            self._policy_applied(client.client_id, client.policy, "listener")
        return listener

    async def add_forwarder(
        self, listen: str, route: str, *, netns: str | None = None, client_id: str | None = None
    ) -> Listener:
        """A plain TCP forwarder from `HOST:PORT` (in `netns`) to framework route `route`.

        Lets a sandbox reach a framework service on the host's loopback at an address of its
        own (its loopback, or its gateway) without any proxy setting. Every connection is
        audited (method `FORWARD`, reason `framework_route`).
        """
        from ..policy.rules import parse_framework_route

        dest = parse_framework_route(route)
        host, port = parse_listen(listen)
        policy = Policy(framework_routes=[dest])
        return await self._open_listener(
            Listener(host, port, netns, Identity(client_id, policy), (dest.host, dest.port))
        )

    async def remove_listeners(self, netns: str) -> None:
        """Stop every listener opened inside `netns` (a sandbox being released)."""
        for listener in [li for li in self.listeners if li.netns == netns]:
            self.remove_listener(listener)

    def remove_listener(self, listener: Listener) -> bool:
        """Stop `listener` and close the connections it accepted (a released sandbox keeps
        nothing open). Idempotent; False if it was not one of ours."""
        if listener not in self.listeners:
            return False
        self.listeners.remove(listener)
        listener.close()
        for conn in [c for c in self._conns if c.listener is listener]:
            conn.end = End.RELEASED.value
            conn.side.abort()
            if conn.upstream is not None:
                conn.upstream.abort()
        return True

    def reserve(self, network: str) -> None:
        """Refuse `network` from now on, like a `--reserve` CIDR (a fake-IP pool must never
        be dialed: docs/proxy.md#transparent-mode-and-socks5)."""
        from dataclasses import replace

        from ..policy.addrs import parse_cidr

        net = parse_cidr(network)
        guard = self.settings.guard
        if net in guard.extra:
            return
        self.settings = replace(self.settings, guard=replace(guard, extra=(*guard.extra, net)))
        self.gate.set_guard(replace(self.gate.guard, extra=self.settings.guard.extra))

    async def refresh_host_local(self) -> None:
        """Re-read this host's interface addresses into the guard (also done periodically)."""
        if self._fixed_host_local is not None:
            found = self._fixed_host_local
        else:
            found = await local_addresses_async()
        own = {parse_ip_literal(h) for h, _ in self.addresses if not self.listen_netns}
        extra = frozenset(a for a in own if a is not None and not a.is_unspecified)
        self.gate.set_guard(self.settings.guard.with_host_local(found | extra))

    @property
    def guard(self) -> AddressGuard:
        """The address guard in force (the host's own addresses included)."""
        return self.gate.guard

    async def stop(self) -> None:
        """Stop accepting, give open connections `shutdown_grace` seconds, then close them."""
        if self.closing:
            return
        self.closing = True
        if self._started:
            self.steps.closing = self.pool.closing = True
        for listener in self.listeners:
            listener.close()
        tasks = [c.task for c in self._conns if c.task is not None]
        for conn in list(self._conns):
            if conn.phase != "active":
                conn.end = End.SHUTDOWN.value
                conn.side.close()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=self.limits.shutdown_grace)
            for conn in list(self._conns):
                conn.end = End.SHUTDOWN.value
                conn.side.abort()
                if conn.upstream is not None:
                    conn.upstream.abort()
            if pending:
                await asyncio.wait(pending, timeout=1.0)
        for listener in self.listeners:
            if listener.server is not None:
                with contextlib.suppress(Exception):
                    await listener.server.wait_closed()
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        if self._started:
            self.pool.close()
        self.resolver.close()
        if self.admin is not None:
            await self.admin.stop()

    # --- the sweeper: timeouts without per-operation timers --------------------------------
    async def _sweep(self) -> None:
        lim = self.limits
        tick = max(0.05, min(1.0, lim.head_timeout / 4, lim.idle_timeout / 4))
        refresh_every = 30.0
        next_refresh = self.loop.time() + refresh_every
        while True:
            await asyncio.sleep(tick)
            now = self.loop.time()
            for conn in list(self._conns):
                sweep(conn, now, lim)
            self.pool.sweep(now)
            if now >= next_refresh:
                next_refresh = now + refresh_every
                with contextlib.suppress(Exception):
                    await self.refresh_host_local()

    # --- per connection ---------------------------------------------------------------------
    def _accepted(self, side: _ClientSide) -> None:
        assert side.transport is not None
        peer = side.transport.get_extra_info("peername")
        conn = Conn(side, _fmt_addr(peer), peer, side.listener, phase_since=self.loop.time())
        if side.listener.kind == "http" and side.listener.forward_to is None:
            # the forward proxy's kept-alive requests may take the callback fast path; a
            # transparent, SOCKS5 or forwarder connection never does (docs/architecture.md)
            side.conn, side.steps = conn, self.steps
        self._conns.add(conn)
        conn.task = self.loop.create_task(self._serve(conn))

    async def _serve(self, conn: Conn) -> None:
        try:
            open_now, cap = len(self._conns), self.limits.max_connections
            if open_now > cap and reclaim_idle(self._conns):
                open_now -= 1  # the reclaimed connection is on its way out
            audit_ok = self.audit is None or self.audit.accepting
            refusal = admit_connection(open_now, cap, closing=self.closing, audit_ok=audit_ok)
            if refusal is not None:
                # SOCKS5 and transparent clients do not speak HTTP: closed without an answer
                self.steps.refuse_now(conn, refusal, write=conn.listener.kind == "http")
                return
            forward_to = conn.listener.forward_to
            if forward_to is not None:
                await serve_forwarder(self.steps, conn, forward_to)
                return
            if conn.listener.kind != "http":
                await _serve_other(self.steps, conn)
                return
            while await self._one_request(conn):
                pass
        except Exception:  # a bug must never take the proxy down
            log.exception("egress: unexpected error serving %s", conn.client)
        finally:
            self._conns.discard(conn)
            self.steps.release(conn)
            conn.side.close()
            if conn.upstream is not None:
                conn.upstream.close()

    async def _one_request(self, conn: Conn) -> bool:
        """Serve one request; True if the client connection stays open for another."""
        try:
            head = await read_head(conn, self.limits, self.loop)
        except ProtocolError as exc:
            if conn.end == "head_timeout":  # the sweeper already answered 408
                self.steps.refuse_now(conn, HEAD_TIMEOUT, write=False)
            else:
                self.steps.refuse_now(conn, refuse_head(exc))
            return False
        if head is None:
            return False
        conn.phase = "active"
        if head.method == "CONNECT":
            await serve_tunnel(self.steps, conn, head)
            return False
        keep = await serve_request(self.steps, conn, head)
        conn.phase, conn.phase_since = "idle", self.loop.time()
        return keep

class _ClientSide(FastClient):
    """A client connection's socket: tells the proxy when it is accepted."""

    def __init__(self, proxy: EgressProxy, listener: Listener) -> None:
        super().__init__(proxy.loop, max_buffer=proxy.limits.max_head)
        self.proxy = proxy
        self.listener = listener

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.proxy._accepted(self)


async def _serve_other(steps: Steps, conn: Conn) -> None:
    """A SOCKS5, DNS or transparent connection (docs/proxy.md#transparent-mode-and-socks5);
    imported late: those modules build on this one."""
    kind = conn.listener.kind
    if kind == "socks5":
        from .socksserve import serve_socks

        await serve_socks(steps, conn)
    elif kind == "dns":
        from .dnsserve import serve_dns_tcp

        await serve_dns_tcp(steps, conn)
    elif kind == "transparent":
        from .transparent import serve_transparent

        await serve_transparent(steps, conn)
    else:
        raise RuntimeError(f"unexpected listener kind {kind!r}")


def _fmt_addr(peer: object) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        return join_host_port(str(peer[0]), peer[1])
    return "unknown"


__all__ = ["AuditSink", "Conn", "EgressProxy", "Limits", "Listener", "parse_listen"]

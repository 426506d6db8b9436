"""`EgressProxy`: the asyncio forward proxy (CONNECT tunnels and absolute-form HTTP).

Strategy: one coroutine per client connection drives a loop of *read head -> identify ->
decide -> resolve -> guard -> dial -> relay -> audit*; every decision is made by the pure core
(`judge`, `ClientTable`, `wire`, `sni`) and this module only turns it into I/O. Bytes move by
protocol-level relays (`relay.Side`) with flow control, never through a coroutine per chunk.

Every request on a kept-alive client connection is parsed, identified and judged afresh; the
upstream connection it uses comes from a pool keyed by the *checked* address and port, so
reuse never skips a decision. Names are resolved once per decision and only checked
addresses are dialed.

DoS bounds (defaults in `Limits`, each overridable): head size and field count (`wire`), head
read timeout, connect timeout, idle timeout, maximum concurrent client connections (503
beyond), per-transport write buffers (`relay.WRITE_HIGH_WATER`). A sweeper task enforces the
timeouts once per `tick`, so no per-operation timer is armed on the hot path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from . import wire
from .addrs import AddressGuard
from .clients import AuthError, ClientTable, Identity, source_address
from .config import ClientSpec, Settings
from .errors import ProtocolError, TargetError
from .hostaddrs import local_addresses_async
from .judge import judge
from .netns import listen_in_netns
from .policy import Decision, Policy
from .relay import Framer, LengthFramer, RelayEnded, Side
from .resolve import ResolveError, Resolver
from .responses import CONNECT_OK, error_response
from .sni import MAX_HELLO_INPUT, parse_client_hello
from .target import (
    IPAddress,
    Target,
    host_header,
    parse_authority,
    parse_ip_literal,
    parse_url,
    split_host_port,
)
from .validate import as_choice, as_count, as_instance, as_str_list, as_timeout

if TYPE_CHECKING:
    from .dnsanswer import FakeIPs

log = logging.getLogger("egress")

SniMissing = Literal["if-named", "allow", "deny"]
# What a listening socket speaks: the HTTP forward proxy, SOCKS5, or transparent redirects
# (docs/proxy.md#transparent-mode-and-socks5).
ListenerKind = Literal["http", "socks5", "transparent", "dns"]


class AuditSink(Protocol):
    """What the proxy needs of an audit log (`egress.audit.AuditLog` is one)."""

    @property
    def accepting(self) -> bool: ...

    def record(self, event: dict[str, object]) -> None: ...


@dataclass(frozen=True, slots=True)
class Limits:
    """Resource bounds; defaults are SPEC 6's (users may rely on them)."""

    max_head: int = wire.MAX_REQUEST_HEAD_SIZE  # 16 KiB, h11's precedent
    max_headers: int = wire.MAX_REQUEST_HEADERS  # 100
    head_timeout: float = 10.0
    connect_timeout: float = 10.0
    idle_timeout: float = 300.0
    max_connections: int = 1024
    shutdown_grace: float = 5.0
    pool_idle: float = 30.0  # idle upstream keep-alive connections are closed after this
    pool_per_key: int = 64

    def __post_init__(self) -> None:
        """Timeouts finite and > 0, counts >= 1, whatever the entry point (docs/proxy.md#limits)."""
        for name in ("head_timeout", "connect_timeout", "idle_timeout", "shutdown_grace",
                     "pool_idle"):  # fmt: skip
            as_timeout(getattr(self, name), f"Limits {name}")
        for name in ("max_head", "max_headers", "max_connections", "pool_per_key"):
            as_count(getattr(self, name), f"Limits {name}")


@dataclass(slots=True, eq=False)
class _Conn:
    """One client connection's state, for the sweeper and the audit lines."""

    side: Side
    client: str
    peer: object  # the socket's peername; parsed only when a source rule needs it
    listener: Listener
    phase: str = "head"  # head | idle | active
    raw_head: bytes = b""  # the bytes of the request head being served
    phase_since: float = 0.0
    upstream: Side | None = None
    end: str | None = None
    task: asyncio.Task[None] | None = None
    orig_dst: str | None = None  # transparent mode: where the client was going (ip:port)


@dataclass(eq=False)
class Listener:
    """One listening socket. `identity` binds every connection on it to one client (a
    sandbox's own in-namespace listener); `forward_to` makes it a plain TCP forwarder to a
    framework route instead of a proxy."""

    host: str
    port: int
    netns: str | None = None
    identity: Identity | None = None
    forward_to: tuple[str, int] | None = None
    server: asyncio.base_events.Server | None = None
    kind: ListenerKind = "http"
    # transparent mode: the sandbox's fake-IP map (shared with its DNS responder) and, for a
    # DNS listener, its UDP socket beside the TCP one (docs/proxy.md#transparent-mode-and-socks5)
    fake_ips: FakeIPs | None = None
    datagram: asyncio.DatagramTransport | None = None

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def close(self) -> None:
        """Stop accepting (open connections are not touched)."""
        if self.server is not None:
            self.server.close()
        if self.datagram is not None:
            self.datagram.close()


@dataclass(frozen=True, slots=True)
class _Request:
    """An absolute-form request being forwarded: the head and what was judged and dialed."""

    head: wire.RequestHead
    target: Target
    path: str
    explicit_port: bool
    addr: IPAddress


class _Refused(Exception):
    """Internal: answer with an error response and audit it."""

    def __init__(
        self, reason: str, detail: str, decision: str = "block", status: int | None = None,
        rule: str | None = None,
    ) -> None:  # fmt: skip
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        self.decision = decision
        self.status = status
        self.rule = rule


def parse_listen(spec: str) -> tuple[str, int]:
    """`HOST:PORT` / `[v6]:PORT` -> (host, port); ValueError naming the culprit."""
    try:
        host, port = split_host_port(spec)
    except TargetError as exc:
        raise ValueError(f"--listen {spec!r}: {exc}") from None
    if port is None or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"--listen {spec!r}: expected HOST:PORT (port 0 = ephemeral)")
    return host.strip("[]"), int(port)


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
        self.audit = audit
        self.limits = limits or Limits()
        self.sni_missing: SniMissing = sni_missing
        self.clients = ClientTable(self.settings, require_auth=require_auth)
        self.resolver = resolver or Resolver(self.settings.resolve)
        self._fixed_host_local = None if host_local is None else frozenset(host_local)
        self.guard: AddressGuard = self.settings.guard
        self.addresses: list[tuple[str, int]] = []
        self.listeners: list[Listener] = []
        self._conns: set[_Conn] = set()
        self._pool: dict[tuple[IPAddress, int], list[Side]] = {}
        # verdicts per policy *object* (never its id, which a later policy can reuse once
        # this one is freed): the entry dies with the policy (docs/threat-model.md)
        self._cache: weakref.WeakKeyDictionary[Policy, dict[tuple[str, str, int], Decision]]
        self._cache = weakref.WeakKeyDictionary()
        self._targets: dict[str, tuple[Target, bool]] = {}
        self._authorities: dict[str, Target] = {}
        self._addr_texts: dict[IPAddress, str] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        self.hooks: list[Callable[[dict[str, object]], object]] = []

    # --- lifecycle ------------------------------------------------------------------------
    async def __aenter__(self) -> EgressProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def url(self) -> str:
        """`http://HOST:PORT` of the first listener (what HTTP(S)_PROXY should hold)."""
        host, port = self.addresses[0]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

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

    async def start(self) -> None:
        self._loop = loop = asyncio.get_running_loop()
        for host, port in self.listen_specs:
            listener = await self._open_listener(Listener(host, port, self.listen_netns))
            self.addresses.append(listener.address)
        for host, port in self.socks_specs:
            listener = Listener(host, port, self.listen_netns, kind="socks5")
            self.socks_addresses.append((await self._open_listener(listener)).address)
        await self.refresh_host_local()
        self._sweeper = loop.create_task(self._sweep(), name="egress-sweeper")

    async def _open_listener(self, listener: Listener) -> Listener:
        assert self._loop is not None, "start() the proxy first"
        if listener.netns:
            sock = listen_in_netns(listener.netns, listener.host, listener.port)
        else:
            sock = self._listen_here(listener.host, listener.port)
        listener.server = await self._loop.create_server(
            lambda: self._make_side(listener), sock=sock, backlog=1024
        )
        bound = sock.getsockname()
        listener.host, listener.port = str(bound[0]), int(bound[1])
        self.listeners.append(listener)
        return listener

    async def add_listener(
        self, listen: str, *, netns: str | None = None, client: ClientSpec | None = None,
        kind: ListenerKind = "http",
    ) -> Listener:  # fmt: skip
        """Listen on `HOST:PORT` (inside `netns` if given) while running.

        With `client`, every connection on this listener is that client (its policy and
        id), whatever credentials it presents: a listener on a sandbox's own loopback can
        only be reached from inside that sandbox. `kind` says what it speaks: the HTTP
        proxy, SOCKS5, or transparent redirects (a `transparent` listener requires `client`).
        Raises OSError / NamespaceError.
        """
        host, port = parse_listen(listen)
        identity = Identity(client.client_id, client.policy) if client is not None else None
        if kind == "transparent" and identity is None:
            raise ValueError("a transparent listener serves one sandbox: pass client=")
        return await self._open_listener(Listener(host, port, netns, identity, kind=kind))

    async def add_forwarder(
        self, listen: str, route: str, *, netns: str | None = None, client_id: str | None = None
    ) -> Listener:
        """A plain TCP forwarder from `HOST:PORT` (in `netns`) to framework route `route`.

        Lets a sandbox reach a framework service on the host's loopback at an address of its
        own (its loopback, or its gateway) without any proxy setting. Every connection is
        audited (method `FORWARD`, reason `framework_route`).
        """
        from .policy import parse_framework_route

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
            conn.end = "released"
            conn.side.abort()
            if conn.upstream is not None:
                conn.upstream.abort()
        return True

    @staticmethod
    def _listen_here(host: str, port: int) -> socket.socket:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(1024)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        return sock

    def reserve(self, network: str) -> None:
        """Refuse `network` from now on, like a `--reserve` CIDR (a fake-IP pool must never
        be dialed: docs/proxy.md#transparent-mode-and-socks5)."""
        from dataclasses import replace

        from .addrs import parse_cidr

        net = parse_cidr(network)
        guard = self.settings.guard
        if net in guard.extra:
            return
        self.settings = replace(self.settings, guard=replace(guard, extra=(*guard.extra, net)))
        self.guard = replace(self.guard, extra=self.settings.guard.extra)
        self._cache.clear()

    async def refresh_host_local(self) -> None:
        """Re-read this host's interface addresses into the guard (also done periodically)."""
        if self._fixed_host_local is not None:
            found = self._fixed_host_local
        else:
            found = await local_addresses_async()
        own = {parse_ip_literal(h) for h, _ in self.addresses if not self.listen_netns}
        extra = frozenset(a for a in own if a is not None and not a.is_unspecified)
        self.guard = self.settings.guard.with_host_local(found | extra)
        self._cache.clear()

    async def stop(self) -> None:
        """Stop accepting, give open connections `shutdown_grace` seconds, then close them."""
        if self._closing:
            return
        self._closing = True
        for listener in self.listeners:
            listener.close()
        tasks = [c.task for c in self._conns if c.task is not None]
        for conn in list(self._conns):
            if conn.phase != "active":
                conn.end = "shutdown"
                conn.side.close()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=self.limits.shutdown_grace)
            for conn in list(self._conns):
                conn.end = "shutdown"
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
        for sides in self._pool.values():
            for side in sides:
                side.close()
        self._pool.clear()
        self.resolver.close()

    async def serve_forever(self) -> None:
        """Serve until cancelled (for standalone use)."""
        await asyncio.Event().wait()

    # --- the sweeper: timeouts without per-operation timers --------------------------------
    async def _sweep(self) -> None:
        lim = self.limits
        tick = max(0.05, min(1.0, lim.head_timeout / 4, lim.idle_timeout / 4))
        refresh_every = 30.0
        assert self._loop is not None
        next_refresh = self._loop.time() + refresh_every
        while True:
            await asyncio.sleep(tick)
            now = self._loop.time()
            for conn in list(self._conns):
                self._sweep_one(conn, now)
            self._sweep_pool(now)
            if now >= next_refresh:
                next_refresh = now + refresh_every
                with contextlib.suppress(Exception):
                    await self.refresh_host_local()

    def _sweep_one(self, conn: _Conn, now: float) -> None:
        lim = self.limits
        if conn.phase == "hello" and now - conn.phase_since > lim.head_timeout:
            conn.end = "hello_timeout"  # inside an open tunnel: nothing to answer, just close
            conn.side.close()
            if conn.upstream is not None:
                conn.upstream.close()
            return
        if conn.phase == "head" and now - conn.phase_since > lim.head_timeout:
            conn.end = "head_timeout"
            if conn.side.buf:
                conn.side.write(error_response("head_timeout", "request head not received")[1])
            conn.side.close()
            return
        last = conn.side.last_active
        if conn.upstream is not None:
            last = max(last, conn.upstream.last_active)
        if now - last > lim.idle_timeout:
            conn.end = "idle_timeout"
            conn.side.close()
            if conn.upstream is not None:
                conn.upstream.close()

    def _sweep_pool(self, now: float) -> None:
        for key, sides in list(self._pool.items()):
            keep = []
            for side in sides:
                if side.eof or now - side.last_active > self.limits.pool_idle:
                    side.close()
                else:
                    keep.append(side)
            if keep:
                self._pool[key] = keep
            else:
                del self._pool[key]

    # --- per connection ---------------------------------------------------------------------
    def _make_side(self, listener: Listener) -> Side:
        assert self._loop is not None
        side = _ClientSide(self._loop, max_buffer=self.limits.max_head)
        side.proxy = self
        side.listener = listener
        return side

    def _accepted(self, side: Side) -> None:
        assert self._loop is not None
        assert side.transport is not None
        peer = side.transport.get_extra_info("peername")
        listener = side.listener  # type: ignore[attr-defined]
        conn = _Conn(side, _fmt_addr(peer), peer, listener, phase_since=self._loop.time())
        self._conns.add(conn)
        conn.task = self._loop.create_task(self._serve(conn))

    async def _serve(self, conn: _Conn) -> None:
        try:
            if len(self._conns) > self.limits.max_connections or self._closing:
                self._refuse_now(conn, "too_many_connections", "connection limit reached")
                return
            if self.audit is not None and not self.audit.accepting:
                self._refuse_now(conn, "audit_unavailable", "audit log cannot be written")
                return
            if conn.listener.forward_to is not None:
                await self._forward_raw(conn, conn.listener)
                return
            if conn.listener.kind != "http":
                await _serve_other(self, conn)
                return
            while await self._one_request(conn):
                pass
        except Exception:  # a bug must never take the proxy down
            log.exception("egress: unexpected error serving %s", conn.client)
        finally:
            self._conns.discard(conn)
            conn.side.close()
            if conn.upstream is not None:
                conn.upstream.close()

    def _refuse_now(
        self, conn: _Conn, reason: str, detail: str, status: int | None = None,
        *, answer: bool | None = None,
    ) -> None:  # fmt: skip
        """Answer and audit a refusal that comes before any request was understood.

        `answer` (default: on an HTTP proxy listener) writes the HTTP error response; a SOCKS5
        or raw transparent client does not speak HTTP and is closed without one."""
        status, data = error_response(reason, detail, status=status)
        event = self._event(conn, "-", "", "", 0)
        if answer if answer is not None else conn.listener.kind == "http":
            conn.side.write(data)
        else:
            status = None
        self._emit(event, "error", reason, None, detail, status)

    async def _read_head(self, conn: _Conn) -> wire.RequestHead | None:
        side = conn.side
        assert self._loop is not None
        searched = 0  # bytes already scanned for the end of the head (no quadratic rescans)
        while True:
            if side.buf:
                if conn.phase == "idle":
                    conn.phase, conn.phase_since = "head", self._loop.time()
                parsed = wire.parse_request_head(
                    side.buf, max_size=self.limits.max_head,
                    max_headers=self.limits.max_headers, searched=searched,
                )  # fmt: skip
                if parsed is not None:
                    head, used = parsed
                    conn.raw_head = bytes(side.buf[:used])
                    side.consume(used)
                    return head
                searched = len(side.buf)
            if not await side.read_more():
                if side.buf:
                    raise ProtocolError("connection closed inside a request head", 400)
                return None

    async def _one_request(self, conn: _Conn) -> bool:
        """Serve one request; True if the client connection stays open for another."""
        try:
            head = await self._read_head(conn)
        except ProtocolError as exc:
            reason = "head_too_large" if exc.status == 431 else "bad_request"
            self._refuse_now(conn, reason, str(exc), exc.status)
            return False
        if head is None:
            return False
        assert self._loop is not None
        conn.phase = "active"
        if head.method == "CONNECT":
            await self._tunnel(conn, head)
            return False
        keep = await self._http(conn, head)
        conn.phase, conn.phase_since = "idle", self._loop.time()
        return keep

    # --- decisions ----------------------------------------------------------------------------
    def _identify(self, conn: _Conn, head: wire.RequestHead) -> Identity:
        if conn.listener.identity is not None:
            return conn.listener.identity
        if self.clients.trivial:
            return self.clients.default
        try:
            source = source_address(conn.peer) if self.clients.by_source else None
            return self.clients.identify(source, head.get("proxy-authorization"))
        except AuthError as exc:
            raise _Refused(exc.reason, str(exc), status=407) from None

    def _decide_name(self, identity: Identity, target: Target) -> Decision:
        per_policy = self._cache.get(identity.policy)
        if per_policy is None:
            per_policy = self._cache[identity.policy] = {}
        key = (target.scheme, target.host, target.port)
        decision = per_policy.get(key)
        if decision is None:
            decision = judge(identity.policy, self.guard, target)
            if len(per_policy) > 65536:
                per_policy.clear()
            per_policy[key] = decision
        return decision

    async def _authorize(
        self, identity: Identity, target: Target, event: dict[str, object]
    ) -> tuple[Decision, tuple[IPAddress, ...]]:
        """Decide, resolve, re-judge on the addresses; raise `_Refused` for any refusal."""
        decision = self._decide_name(identity, target)
        if not decision.allowed and not decision.needs_addrs:
            raise _Refused(decision.reason, decision.detail, rule=decision.rule)
        if target.ip is not None:
            addrs: tuple[IPAddress, ...] = (target.ip,)
        else:
            try:
                addrs = await self.resolver.resolve(target.host)
            except ResolveError as exc:
                raise _Refused(exc.reason, str(exc), "error") from None
            if decision.reason != "framework_route":
                decision = judge(identity.policy, self.guard, target, addrs)
                if not decision.allowed:
                    raise _Refused(decision.reason, decision.detail, rule=decision.rule)
        event["rule"] = decision.rule
        event["reason"] = decision.reason
        return decision, addrs

    async def _dial(self, addrs: Sequence[IPAddress], port: int) -> tuple[Side, IPAddress]:
        """Connect to the first reachable checked address; raise `_Refused` on failure."""
        loop = self._loop
        assert loop is not None
        last: _Refused | None = None
        for addr in addrs:
            try:
                async with asyncio.timeout(self.limits.connect_timeout):
                    _, side = await loop.create_connection(lambda: Side(loop), str(addr), port)
                return side, addr
            except TimeoutError:
                last = _Refused("connection_timeout", f"connecting to {addr} port {port} timed out",
                                "error")  # fmt: skip
            except ConnectionRefusedError:
                last = _Refused("connection_refused", f"{addr} port {port} refused the connection",
                                "error")  # fmt: skip
            except OSError as exc:
                last = _Refused("upstream_error", f"cannot connect to {addr} port {port}: "
                                f"{exc.strerror or exc}", "error")  # fmt: skip
        assert last is not None
        raise last

    # --- CONNECT ----------------------------------------------------------------------------
    async def _tunnel(self, conn: _Conn, head: wire.RequestHead) -> None:
        assert self._loop is not None
        t0 = self._loop.time()
        event = self._event(conn, "CONNECT", "https", head.target, 0)
        upstream: Side | None = None
        try:
            target = self._authority_target(head.target)
            event["host"], event["port"] = target.host, target.port
            identity = self._identify(conn, head)
            event["client_id"] = identity.client_id
            decision, addrs = await self._authorize(identity, target, event)
            upstream, addr = await self._dial(addrs, target.port)
            conn.upstream = upstream
            event["addr"] = self._addr_text(addr)
            conn.side.write(CONNECT_OK)
            event["status"] = 200
            if self._wants_sni_check(identity.policy, target):
                await self._check_sni(conn, identity, target, decision, event)
        except _Refused as refused:
            self._answer(conn, event, refused, t0)
            if upstream is not None:
                upstream.close()
            return
        await self._relay_tunnel(conn, upstream, event, t0)

    def _wants_sni_check(self, policy: Policy, target: Target) -> bool:
        if target.port == 443:
            return policy.framework_route(target.host, target.port) is None
        return target.port in policy.https_ports

    async def _check_sni(
        self, conn: _Conn, identity: Identity, target: Target, decision: Decision,
        event: dict[str, object],
    ) -> None:  # fmt: skip
        assert self._loop is not None
        side = conn.side
        conn.phase, conn.phase_since = "hello", self._loop.time()
        side.max_buffer = MAX_HELLO_INPUT  # a ClientHello may be larger than a request head
        while True:
            hello = parse_client_hello(side.buf)
            if hello is not None or not await side.read_more():
                break
        side.max_buffer = self.limits.max_head
        conn.phase = "active"
        if hello is not None and hello.kind == "malformed":
            raise _Refused("sni_mismatch", "malformed TLS ClientHello")
        if hello is None or hello.kind != "tls" or hello.sni is None:
            kind = "no ClientHello" if hello is None else f"{hello.kind} first bytes"
            if hello is not None and hello.kind == "tls":
                kind = "a ClientHello without SNI"
            if not self._sni_missing_ok(target, decision):
                raise _Refused("sni_missing", f"tunnel carried {kind}; policy requires SNI",
                               status=403)  # fmt: skip
            return
        event["sni"] = hello.sni
        if hello.sni == target.host:
            return
        try:
            sni_target = parse_authority(f"{hello.sni}:{target.port}")
        except TargetError:
            raise _Refused("sni_mismatch", f"invalid SNI {hello.sni!r}") from None
        verdict = identity.policy.decide(sni_target)
        if not verdict.allowed:
            raise _Refused("sni_mismatch", f"SNI {hello.sni!r} not allowed on port "
                           f"{target.port} ({verdict.reason})", rule=verdict.rule)  # fmt: skip

    def _sni_missing_ok(self, target: Target, decision: Decision) -> bool:
        if self.sni_missing == "allow":
            return True
        if self.sni_missing == "deny":
            return False
        return target.ip is None and decision.reason in (
            "allow_rule", "default_allow", "framework_route"
        )

    async def _relay_tunnel(
        self, conn: _Conn, upstream: Side | None, event: dict[str, object], t0: float,
        status: int | None = 200,
    ) -> None:  # fmt: skip
        assert upstream is not None
        assert self._loop is not None
        up = conn.side.start_relay(upstream, None)
        down = upstream.start_relay(conn.side, None)
        await _both_or_failure(up, down)
        if not (up.done() and down.done()):
            conn.side.close()
            upstream.close()
            await asyncio.wait((up, down), timeout=1.0)
        end = conn.end or _how_ended(up, down)
        upstream.close()
        event["bytes_up"] = conn.side.bytes_relayed
        event["bytes_down"] = upstream.bytes_relayed
        event["end"] = end
        event["duration_ms"] = round((self._loop.time() - t0) * 1000, 3)
        self._emit(event, "allow", str(event["reason"]), event.get("rule"), None, status)  # type: ignore[arg-type]

    async def _forward_raw(self, conn: _Conn, listener: Listener) -> None:
        """A forwarder connection: relay it to the listener's framework route."""
        assert self._loop is not None
        assert listener.forward_to is not None
        t0 = self._loop.time()
        host, port = listener.forward_to
        event = self._event(conn, "FORWARD", "tcp", host, port)
        event["client_id"] = listener.identity.client_id if listener.identity else None
        conn.phase = "active"
        try:
            ip = parse_ip_literal(host)
            try:
                addrs = (ip,) if ip is not None else await self.resolver.resolve(host)
            except ResolveError as exc:
                raise _Refused(exc.reason, str(exc), "error") from None
            upstream, addr = await self._dial(addrs, port)
        except _Refused as refused:
            event["duration_ms"] = round((self._loop.time() - t0) * 1000, 3)
            self._emit(event, refused.decision, refused.reason, None, refused.detail, None)
            return
        conn.upstream = upstream
        event["addr"] = self._addr_text(addr)
        event["reason"], event["rule"] = "framework_route", f"http://{host}:{port}"
        await self._relay_tunnel(conn, upstream, event, t0)

    # --- absolute-form HTTP -----------------------------------------------------------------
    async def _http(self, conn: _Conn, head: wire.RequestHead) -> bool:
        assert self._loop is not None
        t0 = self._loop.time()
        event = self._event(conn, head.method, "http", "", 0)
        upstream: Side | None = None
        try:
            target, path, explicit_port = self._absolute_target(head.target)
            event["host"], event["port"], event["path"] = target.host, target.port, path
            identity = self._identify(conn, head)
            event["client_id"] = identity.client_id
            _, addrs = await self._authorize(identity, target, event)
            upstream, addr = await self._acquire(addrs, target.port)
            conn.upstream = upstream
            event["addr"] = self._addr_text(addr)
            request = _Request(head, target, path, explicit_port, addr)
            return await self._exchange(conn, request, upstream, event, t0)
        except _Refused as refused:
            if upstream is not None:
                upstream.close()
            # a policy refusal of a bodiless request leaves the connection usable
            keep = (
                head.framing.kind == "none"
                and head.keep_alive
                and refused.decision == "block"
                and refused.status is None
                and not self._closing
            )
            self._answer(conn, event, refused, t0, close=not keep)
            return keep
        finally:
            conn.upstream = None

    def _addr_text(self, addr: IPAddress) -> str:
        text = self._addr_texts.get(addr)
        if text is None:
            if len(self._addr_texts) > 65536:
                self._addr_texts.clear()
            text = self._addr_texts[addr] = str(addr)
        return text

    def _authority_target(self, authority: str) -> Target:
        """A CONNECT target, parsed once per distinct authority (parsing is pure)."""
        cached = self._authorities.get(authority)
        if cached is None:
            try:
                cached = parse_authority(authority)
            except TargetError as exc:
                raise _Refused("bad_request", str(exc), "error", status=400) from None
            if len(self._authorities) > 65536:
                self._authorities.clear()
            self._authorities[authority] = cached
        return cached

    def _absolute_target(self, raw: str) -> tuple[Target, str, bool]:
        """Split an absolute-form target; the authority's `Target` is cached (it is pure)."""
        if raw[:7].lower() != "http://":
            raise _Refused("bad_request", _form_error(raw), "error", status=400)
        end = len(raw)
        for ch in "/?#":
            pos = raw.find(ch, 7)
            if 0 <= pos < end:
                end = pos
        authority, path = raw[7:end], raw[end:]
        if "#" in path:
            path = path.split("#", 1)[0]
        if not path.startswith("/"):
            path = "/" + path
        cached = self._targets.get(authority)
        if cached is None:
            try:
                parsed = parse_url("http://" + authority)
            except TargetError as exc:
                raise _Refused("bad_request", str(exc), "error", status=400) from None
            if len(self._targets) > 65536:
                self._targets.clear()
            cached = self._targets[authority] = (parsed.target, parsed.explicit_port)
        return cached[0], path, cached[1]

    async def _acquire(self, addrs: Sequence[IPAddress], port: int) -> tuple[Side, IPAddress]:
        """An idle pooled connection to one of the checked `addrs`, or a new one."""
        for addr in addrs:
            idle = self._pool.get((addr, port))
            while idle:
                side = idle.pop()
                t = side.transport
                if not side.eof and not side.buf and t is not None and not t.is_closing():
                    return side, addr
                side.close()
        return await self._dial(addrs, port)

    def _release(self, upstream: Side, ip: IPAddress, port: int) -> None:
        if upstream.eof or upstream.buf or self._closing:
            upstream.close()
            return
        idle = self._pool.setdefault((ip, port), [])
        if len(idle) >= self.limits.pool_per_key:
            upstream.close()
            return
        idle.append(upstream)

    async def _exchange(
        self, conn: _Conn, req: _Request, upstream: Side, event: dict[str, object], t0: float
    ) -> bool:
        """Send the request, relay the response; True if the client connection may go on."""
        assert self._loop is not None
        head = req.head
        host = host_header(req.target, req.explicit_port)
        try:
            out = wire.passthrough_request_head(head, conn.raw_head, req.path, host)
            if out is None:
                fields = wire.forward_headers(head, host)
                out = wire.serialize_request_head(
                    head.method, req.path, fields, version=head.version
                )
        except (ValueError, UnicodeEncodeError) as exc:
            raise _Refused(
                "bad_request", f"cannot forward request: {exc}", "error", status=400
            ) from None
        upstream.write(out)
        body = _framer(head.framing, 400)
        req_done = conn.side.start_relay(upstream, body) if body is not None else None
        if req_done is not None:
            # a malformed or truncated request body ends the exchange at once
            req_done.add_done_callback(lambda f: _abort_on_error(f, upstream))
        try:
            resp, resp_raw = await self._read_response(conn, head, upstream)
        except _Refused:
            if req_done is not None:
                _raise_body_error(req_done)
            raise
        event["status"] = resp.status
        keep = head.keep_alive and resp.keep_alive and not self._closing
        passthrough = keep and head.version == "HTTP/1.1"
        raw = wire.passthrough_response_head(resp, resp_raw) if passthrough else None
        if raw is not None:
            out = raw
        else:
            rfields = wire.forward_response_headers(resp)
            if not keep:
                rfields.append(("Connection", "close"))
            elif head.version == "HTTP/1.0":
                rfields.append(("Connection", "keep-alive"))
            out = wire.serialize_response_head(resp.status, resp.reason, rfields)
        ok = await self._relay_response(conn, resp, upstream, out, event)
        if req_done is not None:
            if not req_done.done():
                conn.side.close()  # the upstream answered before the body ended: stop both
            ok = _settle(req_done) and ok
        keep = keep and ok and resp.framing.kind != "close"
        event["bytes_up"] = conn.side.bytes_relayed
        event["bytes_down"] = upstream.bytes_relayed
        conn.side.bytes_relayed = upstream.bytes_relayed = 0
        event["duration_ms"] = round((self._loop.time() - t0) * 1000, 3)
        self._emit(event, "allow", event["reason"], event["rule"], None, resp.status)  # type: ignore[arg-type]
        if ok and resp.keep_alive:
            self._release(upstream, req.addr, req.target.port)
        else:
            upstream.close()
        return keep

    async def _relay_response(
        self, conn: _Conn, resp: wire.ResponseHead, upstream: Side, head_bytes: bytes,
        event: dict[str, object],
    ) -> bool:  # fmt: skip
        """Write the response head and relay its body (one write when it is all buffered)."""
        kind = resp.framing.kind
        if kind == "none":
            conn.side.write(head_bytes)
            return True
        if kind == "close":
            conn.side.write(head_bytes)
            with contextlib.suppress(RelayEnded):
                await upstream.start_relay(conn.side, None)
            return True
        framer = _framer(resp.framing, 502)
        if framer is None:  # Content-Length: 0
            conn.side.write(head_bytes)
            return True
        try:
            await upstream.start_relay(conn.side, framer, prefix=head_bytes)
        except RelayEnded as exc:
            event["end"] = f"upstream_{exc.reason}"
            return False
        return True

    async def _read_response(
        self, conn: _Conn, head: wire.RequestHead, upstream: Side
    ) -> tuple[wire.ResponseHead, bytes]:
        """The final response head (1xx relayed on the way) and its exact bytes."""
        searched = 0
        while True:
            try:
                parsed = wire.parse_response_head(
                    upstream.buf, request_method=head.method, searched=searched
                )
            except ProtocolError as exc:
                raise _Refused("upstream_error", f"malformed response: {exc}", "error",
                               status=502) from None  # fmt: skip
            if parsed is not None:
                resp, used = parsed
                raw = bytes(upstream.buf[:used])
                upstream.consume(used)
                if 100 <= resp.status < 200 and resp.status != 101:
                    conn.side.write(raw)
                    searched = 0
                    continue
                if resp.status == 101:
                    raise _Refused("upstream_error", "upstream switched protocols (Upgrade is "
                                   "not forwarded)", "error", status=502)  # fmt: skip
                return resp, raw
            searched = len(upstream.buf)
            if not await upstream.read_more():
                raise _Refused("upstream_error", "upstream closed before a response", "error",
                               status=502)  # fmt: skip

    # --- answers and audit ----------------------------------------------------------------
    def _answer(
        self, conn: _Conn, event: dict[str, object], refused: _Refused, t0: float,
        close: bool = True,
    ) -> None:  # fmt: skip
        """Write the refusal (unless the tunnel is already open) and audit it."""
        assert self._loop is not None
        status: int | None
        if event.get("status") == 200 and event["method"] == "CONNECT":
            status = 200  # refused after the tunnel opened (SNI): close, nothing to say
        else:
            status, data = error_response(refused.reason, refused.detail, status=refused.status,
                                          close=close)  # fmt: skip
            conn.side.write(data)
        event["duration_ms"] = round((self._loop.time() - t0) * 1000, 3)
        self._emit(event, refused.decision, refused.reason, refused.rule, refused.detail, status)

    def _event(
        self, conn: _Conn, method: str, scheme: str, host: str, port: int
    ) -> dict[str, object]:
        event: dict[str, object] = {"client": conn.client, "method": method, "scheme": scheme,
                                    "host": host, "port": port}  # fmt: skip
        if conn.listener.kind != "http":  # docs/audit-log.md: SOCKS5 and transparent records
            event["mode"] = conn.listener.kind
            if conn.orig_dst is not None:
                event["orig_dst"] = conn.orig_dst
        return event

    def _emit(
        self, event: dict[str, object], decision: str, reason: str, rule: str | None,
        detail: str | None, status: int | None,
    ) -> None:  # fmt: skip
        event["decision"] = decision
        event["reason"] = reason
        event["rule"] = rule
        if status is not None:
            event["status"] = status
        if detail is not None:
            event["detail"] = detail
        if self.audit is not None:
            self.audit.record(event)
        for hook in self.hooks:
            hook(event)


class _ClientSide(Side):
    proxy: EgressProxy
    listener: Listener

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.proxy._accepted(self)


async def _serve_other(proxy: EgressProxy, conn: _Conn) -> None:
    """A SOCKS5 or transparent connection (imported late: those modules build on this one)."""
    if conn.listener.kind == "socks5":
        from .socksserve import serve_socks

        await serve_socks(proxy, conn)
    elif conn.listener.kind == "dns":
        from .dnsserve import serve_dns_tcp

        await serve_dns_tcp(proxy, conn)
    else:
        from .transparent import serve_transparent

        await serve_transparent(proxy, conn)


def _framer(framing: wire.BodyFraming, status: int) -> Framer | None:
    if framing.kind == "length":
        return LengthFramer(framing.length) if framing.length else None
    if framing.kind == "chunked":
        return wire.ChunkedScanner(error_status=status)
    return None


def _raise_body_error(req_done: asyncio.Future[None]) -> None:
    """If the request body relay failed, answer that (400) rather than the upstream's fate."""
    if not req_done.done() or _settle(req_done):
        if not req_done.done():
            _settle(req_done)
        return
    exc = req_done.exception() if not req_done.cancelled() else None
    if isinstance(exc, RelayEnded) and exc.reason == "protocol":
        raise _Refused("bad_request", f"malformed request body: {exc}", "error", status=400)
    raise _Refused("bad_request", "client closed inside the request body", "error", status=400)


def _abort_on_error(fut: asyncio.Future[None], upstream: Side) -> None:
    if fut.cancelled() or fut.exception() is not None:
        upstream.abort()


def _settle(fut: asyncio.Future[None]) -> bool:
    """True if a relay future ended cleanly; marks its exception retrieved either way."""
    if not fut.done():
        fut.cancel()
        return False
    if fut.cancelled():
        return False
    return fut.exception() is None


async def _both_or_failure(a: asyncio.Future[None], b: asyncio.Future[None]) -> None:
    """Wait until both futures are done, or one failed (cheaper than `asyncio.wait`)."""
    if a.done() and b.done():
        return
    waiter: asyncio.Future[None] = a.get_loop().create_future()

    def check(_: object) -> None:
        if waiter.done():
            return
        failed = any(f.done() and (f.cancelled() or f.exception()) for f in (a, b))
        if failed or (a.done() and b.done()):
            waiter.set_result(None)

    a.add_done_callback(check)
    b.add_done_callback(check)
    check(None)
    await waiter


def _how_ended(up: asyncio.Future[None], down: asyncio.Future[None]) -> str:
    """`eof` for a clean end both ways, else the first direction's failure reason."""
    reasons = []
    for fut in (up, down):
        if not fut.done():
            fut.cancel()
        elif not fut.cancelled():
            exc = fut.exception()  # also marks it retrieved
            if isinstance(exc, RelayEnded):
                reasons.append(exc.reason)
    return reasons[0] if reasons else "eof"


def _form_error(target: str) -> str:
    if target.startswith("/"):
        return "origin-form request: this is a forward proxy, send absolute-form (http://host/)"
    if target == "*":
        return "asterisk-form request is not supported by a forward proxy"
    if target.lower().startswith("https://"):
        return "absolute-form https:// request: use CONNECT for TLS"
    return f"unsupported request target {target[:100]!r}"


def _fmt_addr(peer: object) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        host = str(peer[0])
        return f"[{host}]:{peer[1]}" if ":" in host else f"{host}:{peer[1]}"
    return "unknown"


__all__ = ["AuditSink", "EgressProxy", "Limits", "parse_listen"]

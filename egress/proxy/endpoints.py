"""`ListenerControl`: the listeners half of `EgressProxy`'s public API, and `ClientSide`.

Shell. Opening a listening socket (here or inside a sandbox's namespace) and serving it from
the proxy's loop; listeners added while running, of every kind (HTTP proxy, SOCKS5,
transparent, and framework-route forwarders: docs/proxy.md#transparent-mode-and-socks5,
docs/proxy.md#listening-inside-a-namespace-framework-route-forwarders); removing one and
closing what it accepted. A component of `EgressProxy` (`server.py`): it is handed the
proxy's `ProxyContext` (`context.py`: the listeners, the open connections) and the two
callables an accepted socket goes to, never the proxy; its public methods are the bodies of
`EgressProxy`'s of the same name, which document them (once, where users read). It owns
what accepting needs besides: the listen backlog, the descriptor held back for a refusal
when none is left, and the count of failed accepts (docs/proxy.md#file-descriptors). The
socket itself is `listener.listen_socket`; `ClientSide` is an accepted connection's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import resource
import socket
from collections.abc import Callable

from ..config import ClientSpec
from ..policy.rules import Policy, parse_framework_route
from ..policy.target import join_host_port
from ..reasons import End
from .context import ProxyContext
from .core.clients import Identity
from .drive.callback import FastClient
from .fdbudget import AcceptFailures, plan_fds
from .net.accept import Acceptor, Reserve
from .net.conn import Limits
from .net.listener import (
    BACKLOG,
    Listener,
    ListenerKind,
    ListenError,
    listen_socket,
    parse_listen,
)
from .net.netns import listen_in_netns_async

log = logging.getLogger("egress")

# what a listener hands each accepted socket to: `Intake.take`, or its refusal when the
# socket came from the descriptor held back (docs/proxy.md#file-descriptors)
Take = Callable[[Listener, socket.socket, object], None]


class ClientSide(FastClient):
    """A client connection's socket: tells the proxy when it is accepted (a forward-proxy
    connection's kept-alive requests may then take the callback fast path, `drive/callback.py`)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, max_head: int, listener: Listener) -> None:
        super().__init__(loop, max_buffer=max_head)
        self.listener = listener


class ListenerControl:
    """The proxy's listening sockets, a component of `EgressProxy`."""

    def __init__(
        self, context: ProxyContext, take: Take, refuse: Take, *, reuse_port: bool
    ) -> None:
        self.context = context
        self.take = take
        self.refuse = refuse
        self.reuse_port = reuse_port  # share listen ports with other workers (serve --workers)
        self.backlog = BACKLOG  # kept when descriptors are scarce (fdbudget.py)
        self.reserve = Reserve()  # one descriptor to answer with when none is left
        self.accept_failures = AcceptFailures()
        self.fd_note: str | None = None  # what the descriptor budget changed, if anything

    def fit_descriptors(self, limits: Limits, admin: int) -> Limits:
        """`limits` with `max_connections` made to fit RLIMIT_NOFILE (`admin`: the admin
        listener's connections): the soft limit is raised when it is lower than the cap
        needs, else the cap is lowered and the note says so; the listen backlog keeps its
        length (docs/proxy.md#file-descriptors)."""
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        top = None if hard == resource.RLIM_INFINITY else hard
        try:
            in_use = len(os.listdir("/proc/self/fd"))
        except OSError:
            in_use = 0
        cap = limits.max_connections
        plan = plan_fds(cap, BACKLOG, admin + in_use, soft, top)
        if plan.soft != soft:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (plan.soft, hard))
            except (ValueError, OSError):
                plan = plan_fds(cap, BACKLOG, admin + in_use, soft, soft)
        self.backlog = plan.backlog
        self.fd_note = plan.note
        if plan.note is not None:
            log.warning("egress: %s", plan.note)
        if plan.max_connections == cap:
            return limits
        return dataclasses.replace(limits, max_connections=plan.max_connections)

    async def open_as(self, role: str, listener: Listener) -> Listener:
        """Open one of the proxy's own listeners (`role`: proxy, socks5); `ListenError`
        names which one failed."""
        try:
            return await self.open(listener)
        except OSError as exc:
            if isinstance(exc, ListenError):
                raise
            raise ListenError(role, join_host_port(listener.host, listener.port), exc) from exc

    async def open(self, listener: Listener, sock: socket.socket | None = None) -> Listener:
        """Serve `listener` on `sock` when given (a socket a helper opened inside the
        sandbox's namespace and passed back: docs/user-guide.md#helper-mode), else on one
        opened here (inside `listener.netns` when set)."""
        backlog = self.backlog
        if sock is None and listener.netns:
            sock = await listen_in_netns_async(
                listener.netns, listener.host, listener.port, backlog=backlog
            )
        elif sock is None:
            sock = listen_socket(listener.host, listener.port, backlog, reuse_port=self.reuse_port)
        take, refuse = self.take, self.refuse
        loop = self.context.loop
        assert loop is not None, "listeners are served once the proxy is started"
        acceptor = Acceptor(
            loop,
            sock,
            lambda s, addr: take(listener, s, addr),
            lambda s, addr: refuse(listener, s, addr),
            self.reserve,
            self.accept_failures,
        )
        listener.acceptor = acceptor
        acceptor.start()
        bound = sock.getsockname()
        listener.host, listener.port = str(bound[0]), int(bound[1])
        self.context.listeners.append(listener)
        return listener

    async def add_listener(
        self,
        listen: str,
        *,
        netns: str | None = None,
        client: ClientSpec | None = None,
        kind: ListenerKind = "http",
    ) -> Listener:
        host, port = parse_listen(listen)
        identity = Identity(client.client_id, client.policy) if client is not None else None
        if kind == "transparent" and identity is None:
            raise ValueError("a transparent listener serves one sandbox: pass client=")
        return await self.open(Listener(host, port, netns, identity, kind=kind))

    async def add_forwarder(
        self, listen: str, route: str, *, netns: str | None = None, client_id: str | None = None
    ) -> Listener:
        dest = parse_framework_route(route)
        host, port = parse_listen(listen)
        policy = Policy(framework_routes=[dest])
        return await self.open(
            Listener(host, port, netns, Identity(client_id, policy), (dest.host, dest.port))
        )

    async def remove_listeners(self, netns: str) -> None:
        for listener in [li for li in self.context.listeners if li.netns == netns]:
            self.remove_listener(listener)

    def remove_listener(self, listener: Listener) -> bool:
        listeners = self.context.listeners
        if listener not in listeners:
            return False
        listeners.remove(listener)
        listener.close()
        for conn in list(self.context.conns):
            if conn.listener is not listener:
                continue
            conn.cut_by(End.RELEASED)
            conn.side.abort()
            if conn.upstream is not None:
                conn.upstream.abort()
        return True


__all__ = ["ClientSide", "ListenerControl"]

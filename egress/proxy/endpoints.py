"""`ListenerControl`: the listeners half of `EgressProxy`'s public API, and `ClientSide`.

Shell. Opening a listening socket (here or inside a sandbox's namespace) and serving it from
the proxy's loop; listeners added while running, of every kind (HTTP proxy, SOCKS5,
transparent, and framework-route forwarders: docs/proxy.md#transparent-mode-and-socks5,
docs/proxy.md#listening-inside-a-namespace-framework-route-forwarders); removing one and
closing what it accepted. A component of `EgressProxy` (`server.py`): its public methods
are the bodies of `EgressProxy`'s of the same name, which document them (once, where users
read). The socket itself is `listener.listen_socket`; `ClientSide` hands each accepted
connection to the proxy.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

from ..config import ClientSpec
from ..policy.rules import Policy, parse_framework_route
from ..reasons import End
from .core.clients import Identity
from .drive.callback import FastClient
from .net.accept import Acceptor
from .net.listener import Listener, ListenerKind, listen_socket, parse_listen
from .net.netns import listen_in_netns_async

if TYPE_CHECKING:
    from .server import EgressProxy


class ClientSide(FastClient):
    """A client connection's socket: tells the proxy when it is accepted (a forward-proxy
    connection's kept-alive requests may then take the callback fast path, `drive/callback.py`)."""

    def __init__(self, proxy: EgressProxy, listener: Listener) -> None:
        super().__init__(proxy.loop, max_buffer=proxy.limits.max_head)
        self.listener = listener


class ListenerControl:
    """The proxy's listening sockets, a component of `EgressProxy`."""

    def __init__(self, proxy: EgressProxy) -> None:
        self.proxy = proxy

    async def open(self, listener: Listener, sock: socket.socket | None = None) -> Listener:
        """Serve `listener` on `sock` when given (a socket a helper opened inside the
        sandbox's namespace and passed back: docs/user-guide.md#helper-mode), else on one
        opened here (inside `listener.netns` when set)."""
        backlog = self.proxy.backlog
        if sock is None and listener.netns:
            sock = await listen_in_netns_async(
                listener.netns, listener.host, listener.port, backlog=backlog
            )
        elif sock is None:
            sock = listen_socket(
                listener.host, listener.port, backlog, reuse_port=self.proxy.reuse_port
            )
        acceptor = Acceptor(
            self.proxy.loop,
            sock,
            lambda s, addr: self.proxy._take(listener, s, addr),
            lambda s, addr: self.proxy._refuse_exhausted(listener, s, addr),
            self.proxy._reserve,
            self.proxy._accept_failures,
        )
        listener.acceptor = acceptor
        acceptor.start()
        bound = sock.getsockname()
        listener.host, listener.port = str(bound[0]), int(bound[1])
        self.proxy.listeners.append(listener)
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
        listener = await self.open(Listener(host, port, netns, identity, kind=kind))
        if client is not None:
            self.proxy.tenants.policy_applied(client.client_id, client.policy, "listener")
        return listener

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
        for listener in [li for li in self.proxy.listeners if li.netns == netns]:
            self.remove_listener(listener)

    def remove_listener(self, listener: Listener) -> bool:
        if listener not in self.proxy.listeners:
            return False
        self.proxy.listeners.remove(listener)
        listener.close()
        for conn in [c for c in self.proxy._conns if c.listener is listener]:
            conn.end = End.RELEASED.value
            conn.side.abort()
            if conn.upstream is not None:
                conn.upstream.abort()
        return True


__all__ = ["ClientSide", "ListenerControl"]

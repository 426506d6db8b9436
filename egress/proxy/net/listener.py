"""Listening sockets: the `Listener` record, `--listen` parsing, and the one socket helper.

Shell (creates sockets). `listen_socket` is the only place a listening socket is made; the
namespace variant (`netns.listen_in_netns`) runs the same function in a thread that entered
the sandbox's namespace (docs/proxy.md#listening-inside-a-namespace-framework-route-forwarders).
"""

from __future__ import annotations

import asyncio
import errno
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ...errors import TargetError
from ...policy.target import join_host_port, split_host_port
from ..core.clients import Identity
from ..modes.kinds import ListenerMode, mode_for

if TYPE_CHECKING:
    from ..codec.dns import FakeIPs
    from .accept import Acceptor

BACKLOG = 1024
# What a listening socket speaks: the HTTP forward proxy, SOCKS5, transparent redirects, or
# DNS (docs/proxy.md#transparent-mode-and-socks5).
ListenerKind = Literal["http", "socks5", "transparent", "dns"]


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
    acceptor: Acceptor | None = None  # accepts on its socket (accept.py)
    kind: ListenerKind = "http"
    # transparent mode: the sandbox's fake-IP map (shared with its DNS responder) and, for a
    # DNS listener, its UDP socket beside the TCP one (docs/proxy.md#transparent-mode-and-socks5)
    fake_ips: FakeIPs | None = None
    datagram: asyncio.DatagramTransport | None = None
    # set by `prepare_execution` while it proves the cut: which connections to this
    # listener's own address are the probe's, not the agent's (docs/audit-log.md#sandbox-records)
    probe: ListenerProbe | None = None

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    @property
    def named(self) -> tuple[str, str]:
        """Its `listener` (HOST:PORT) and `mode` as a record names them
        (docs/audit-log.md#connection-records)."""
        kind = "forward" if self.forward_to is not None else self.kind
        return join_host_port(self.host, self.port), kind

    @property
    def mode(self) -> ListenerMode:
        """What it speaks, as an object (`modes/kinds.py`): its front-ends, how a refusal
        at accept is answered, whether its requests may take the fast path."""
        return mode_for(self.kind, self.forward_to is not None)

    def close(self) -> None:
        """Close its sockets, and let go of the acceptor (whose callbacks refer back to this
        listener: a cycle that would outlive a released sandbox until a full collection,
        docs/proxy.md#garbage-collection)."""
        acceptor, self.acceptor = self.acceptor, None
        if acceptor is not None:
            acceptor.close()
        if self.datagram is not None:
            self.datagram.close()


class ListenerProbe:
    """Which connections to a listener's own address are `prepare_execution`'s probe.

    Told apart by their source address, which the probe reports when it returns (netcut's
    `ProbeItem.source`), never by when they arrive: a busy proxy may accept the probe's
    connection after the probe returned, and an agent's connection may come at any time
    (docs/audit-log.md#sandbox-records). A connection accepted while the probe still runs
    waits for its result."""

    __slots__ = ("_done", "_sources")

    def __init__(self) -> None:
        self._done = asyncio.Event()
        self._sources: set[str] = set()

    def finish(self, sources: Iterable[str]) -> None:
        """The probe returned: these are its connections (none if it failed)."""
        self._sources.update(sources)
        self._done.set()

    async def claims(self, client: str) -> bool:
        """Whether the connection from `client` (`ip:port`) is one of the probe's; each is
        claimed once."""
        await self._done.wait()
        if client in self._sources:
            self._sources.discard(client)
            return True
        return False


class ListenError(OSError):
    """A listener could not be opened; names which one (`role`: `proxy`, `socks5`,
    `admin`) and its address, so that a caller can say which of its options failed."""

    def __init__(self, role: str, address: str, cause: OSError) -> None:
        why = cause.strerror or str(cause)
        if "address already in use" in why.lower():  # aiohttp's text differs from the OS's
            why = "address already in use"
        super().__init__(cause.errno, f"{role} listener {address}: {why}")
        self.role, self.address, self.why = role, address, why


def parse_listen(spec: str, flag: str = "--listen") -> tuple[str, int]:
    """`HOST:PORT` / `[v6]:PORT` -> (host, port); ValueError naming the culprit."""
    try:
        host, port = split_host_port(spec)
    except TargetError as exc:
        raise ValueError(f"{flag} {spec!r}: {exc}") from None
    if port is None or not (port.isascii() and port.isdigit()):  # "٣١٢٨" is not a port
        raise ValueError(f"{flag} {spec!r}: expected HOST:PORT (port 0 = ephemeral)")
    if int(port) > 65535:
        raise ValueError(
            f"{flag} {spec!r}: port {int(port)} is out of range (0-65535; 0 = ephemeral)"
        )
    return host.strip("[]"), int(port)


def listen_socket(
    host: str, port: int, backlog: int = BACKLOG, *, reuse_port: bool = False
) -> socket.socket:
    """A non-blocking listening TCP socket bound to `host:port` (SO_REUSEADDR).

    `reuse_port` joins the port's SO_REUSEPORT group, so the workers of `egress serve
    --workers N` share it (docs/proxy.md#workers); off otherwise, so no other process of the
    same user can take a share of the proxy's connections.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRNOTAVAIL:  # the same errno, with the way out
            raise OSError(exc.errno, f"{exc.strerror}: {_NOT_HERE.format(host=host)}") from None
        raise
    except BaseException:
        sock.close()
        raise
    return sock


# A gateway that is not an address of the proxy's namespace: rootless podman's (slirp4netns,
# the rootless bridge) lives in a namespace of the user's own (docs/netcut.md#modes-and-privileges).
_NOT_HERE = (
    "{host} is not an address of this process's network namespace (rootless podman: a"
    " container's gateway is not the host's; use loopback mode)"
)


def peer_text(peer: object) -> str:
    """A socket peer as the audit log's `client` field: `ip:port` (`[v6]:port`)."""
    if isinstance(peer, tuple) and len(peer) >= 2:
        return join_host_port(str(peer[0]), peer[1])
    return "unknown"


__all__ = [
    "BACKLOG",
    "Listener",
    "ListenerKind",
    "ListenerProbe",
    "listen_socket",
    "parse_listen",
    "peer_text",
]

"""`Intake`: accepting client connections and serving each one, a component of `EgressProxy`.

Shell. A listener hands every accepted socket to `take`: the connection is admitted (counted
for its client from accept, `admission.py`) and served, or refused at once, before it costs a
transport or a task (docs/proxy.md#limits). A forward-proxy connection may be served from
callbacks (`drive/callback.py`) and get a coroutine only when it needs one (`spawn`); every
other one runs one coroutine, *read head -> exchange -> record*, by its listener's mode
(`modes/`). `finished` is the one end of a connection (its record if the proxy closed it
before any exchange, its slot freed, both sides closed) and `drain` the shutdown's.

It is handed the proxy's `ProxyContext` (the open connections, the audit sink) and, at
start, the running parts (`started`), never the proxy. It owns what only accepting needs:
whether it still accepts (`closing`), readiness, and the refused sockets left to linger.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
import struct
from collections.abc import Coroutine
from typing import Any, Final

from ..errors import ProtocolError
from ..reasons import End, Reason
from .admission import CLIENT_FULL
from .context import ProxyContext
from .core.gate import HEAD_TIMEOUT, Verdict, admit_connection, refuse_head
from .core.responses import error_response
from .endpoints import ClientSide
from .modes.connect import serve_tunnel
from .modes.forwarder import serve_forwarder
from .modes.http import serve_request
from .modes.kinds import PROXY, REDIRECTED, RESOLVER, ROUTE, SOCKS, ListenerMode
from .net.accept import PAUSE, Lingering
from .net.conn import Conn, Limits, read_head
from .net.listener import Listener, peer_text
from .net.stepped import adopt
from .runtime import Steps

log = logging.getLogger("egress")

_RESET: Final = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close sends a reset

OUT_OF_DESCRIPTORS: Final = Verdict(
    Reason.TOO_MANY_CONNECTIONS,
    "out of file descriptors (docs/proxy.md#file-descriptors)",
)


class Intake:
    """The proxy's client connections, from accept to their end."""

    # set by `started`: plain attributes, not properties, because the hot path reads them
    loop: asyncio.AbstractEventLoop
    steps: Steps
    limits: Limits
    lingering: Lingering

    def __init__(self, context: ProxyContext) -> None:
        self.context = context
        self.conns = context.conns
        self.audit = context.audit
        self.closing = False  # stopping: every new connection is refused

    def started(self, loop: asyncio.AbstractEventLoop, steps: Steps, limits: Limits) -> None:
        """The running parts, once the proxy starts (before any listener is opened)."""
        self.loop, self.steps, self.limits = loop, steps, limits
        self.lingering = Lingering(loop)

    def ready(self) -> tuple[bool, str]:
        """(ready, why) for /readyz: listening, not stopping, and the audit log accepting."""
        if self.closing:
            return False, "stopping"
        if not self.context.listeners:
            return False, "not listening"
        if self.audit is not None and not self.audit.accepting:
            return False, "audit log not accepting"
        return True, "ready"

    # --- accept ------------------------------------------------------------------------------
    def take(self, listener: Listener, sock: socket.socket, addr: object) -> None:
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
        self.conns.add(conn)
        if listener.mode.fast_path:
            # the forward proxy's kept-alive requests may take the callback fast path; a
            # transparent, SOCKS5 or forwarder connection never does (docs/architecture.md)
            side.conn, side.steps = conn, steps
            if steps.fast_path:
                # no task yet: its first head decides (a CONNECT is served from callbacks,
                # anything else starts the coroutine: `drive.callback.FastClient.first_head`)
                side.spawn, side.finish = self.spawn, self.finished
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
            self.finished(conn)
        elif conn.end is not None or self.closing:
            conn.side.close()

    def spawn(self, conn: Conn, work: Coroutine[Any, Any, None] | None) -> None:
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
            self.finished(conn)

    def finished(self, conn: Conn) -> None:
        """A connection ended (its coroutine, or the callback driver): its record if the
        proxy closed it before any exchange, its slot freed, both sides closed."""
        if conn not in self.conns:
            return
        self.conns.discard(conn)
        self.steps.connections.closed(conn)
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

    # --- refused at accept -------------------------------------------------------------------
    def _close_refused(
        self, listener: Listener, sock: socket.socket, refusal: Verdict, in_full: bool
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
            self.lingering.close(sock)
        else:
            sock.close()
        if listener.identity is not None and listener.acceptor is not None:
            listener.acceptor.hold(PAUSE)  # its own listener: only refusals to accept

    def refuse_exhausted(self, listener: Listener, sock: socket.socket, addr: object) -> None:
        """A connection accepted with the reserved descriptor: answered 503, recorded."""
        side = ClientSide(self.loop, self.limits.max_head, listener)
        conn = Conn(side, peer_text(addr), addr, listener)
        self._refuse_socket(conn, sock, OUT_OF_DESCRIPTORS)

    def _refuse_socket(self, conn: Conn, sock: socket.socket, refusal: Verdict) -> None:
        """Answer (HTTP) or just close (SOCKS5, DNS, transparent: no protocol to answer in)
        straight on the socket, and record it."""
        sock.setblocking(False)
        if conn.listener.mode.answers_at_accept:
            _, data = error_response(refusal.reason, refusal.detail, status=refusal.status)
            with contextlib.suppress(OSError):
                sock.send(data)
            self.lingering.close(sock)
        else:
            sock.close()
        self.steps.refuse_now(conn, refusal, write=False)
        self.steps.release(conn)

    # --- serving: one coroutine per connection -----------------------------------------------
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
            self.finished(conn)

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

    # --- shutdown ----------------------------------------------------------------------------
    async def drain(self, grace: float) -> None:
        """Stop accepting; give open connections `grace` seconds (an idle one is closed at
        once), then cut what is left (docs/proxy.md#limits, `shutdown_grace`)."""
        self.closing = True
        conns = self.conns
        tasks: list[asyncio.Future[None]] = []
        for conn in conns:
            if conn.task is not None:
                tasks.append(conn.task)
            else:  # served from callbacks (`drive/callback.py`): done when `finished`
                tasks.append(conn.stop_waits(self.loop.create_future()))
        for conn in list(conns):
            if conn.phase != "active":
                conn.cut_by(End.SHUTDOWN)
                conn.side.close()
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=grace)
        for conn in list(conns):
            conn.cut_by(End.SHUTDOWN)
            conn.side.abort()
            if conn.upstream is not None:
                conn.upstream.abort()
            if conn.dialing is not None:
                conn.dialing.cancel()
        if pending:
            await asyncio.wait(pending, timeout=1.0)


@functools.cache
def _answer(refusal: Verdict) -> bytes:
    """The bytes of a refusal's answer at accept (the same few refusals, over and over)."""
    return error_response(refusal.reason, refusal.detail, status=refusal.status)[1]


async def _serve_other(steps: Steps, conn: Conn, mode: ListenerMode) -> None:
    """A SOCKS5, DNS or transparent connection (docs/proxy.md#transparent-mode-and-socks5),
    by its listener's mode; imported on first use: a proxy that never opens such a listener
    never loads them (the DNS codec is dnspython)."""
    if mode is SOCKS:
        from .modes.socks5 import serve_socks

        await serve_socks(steps, conn)
    elif mode is RESOLVER:
        from .modes.dns import serve_dns_tcp

        await serve_dns_tcp(steps, conn)
    elif mode is REDIRECTED:
        from .modes.transparent import serve_transparent

        await serve_transparent(steps, conn)
    else:
        raise RuntimeError(f"unexpected listener mode {mode.name!r}")


__all__ = ["OUT_OF_DESCRIPTORS", "Intake"]

"""Dialing a checked address from callbacks: a non-blocking connect of our own.

Shell. `UpstreamPool.connect` is a coroutine (`loop.create_connection` under
`asyncio.timeout`): a task must wait on it. The callback driver (`fast.py`) dials here
instead: `connect_ex` on a non-blocking socket, the loop's writer callback when it is
done, `SO_ERROR` for the outcome, then the connected socket becomes a transport
(`adopt`). The addresses are tried in order, as the pool does; the connect timeout is
the sweeper's (`expire`, from `conn.sweep`), so no timer is armed per dial
(docs/proxy.md#limits). Metrics: successful connects, as the pool's
(docs/metrics.md).
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
from collections.abc import Callable, Sequence
from ipaddress import IPv6Address

from ...policy.target import IPAddress
from ..core.gate import Refuse, refuse_dial
from ..core.record import perf_counter_ns, seconds_since
from ..telemetry.metrics import ProxyMetrics
from .adopt import adopt
from .relay import Side

Dialed = Callable[["tuple[Side, IPAddress] | Refuse"], None]
_PENDING = frozenset({errno.EINPROGRESS, errno.EAGAIN, errno.EALREADY, errno.EINTR})


class Dialer:
    """One dial in progress: `done((side, addr))` once connected, `done(refusal)` once every
    address failed; called exactly once, from a loop callback."""

    __slots__ = (
        "_addrs",
        "_at",
        "_done",
        "_fd",
        "_loop",
        "_sock",
        "_t0",
        "metrics",
        "port",
        "started",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        addrs: Sequence[IPAddress],
        port: int,
        done: Dialed,
        metrics: ProxyMetrics | None = None,
    ) -> None:
        self._loop = loop
        self._addrs = addrs
        self.port = port
        self._done: Dialed | None = done
        self.metrics = metrics
        self._at = 0
        self._sock: socket.socket | None = None
        self._fd = -1
        self._t0 = 0
        self.started = 0.0  # loop time the current address was tried at (the sweeper's)

    def start(self) -> None:
        self._try(None)

    def _try(self, last: Refuse | None) -> None:
        """Connect to the next address; report `last` when none is left."""
        while self._at < len(self._addrs):
            addr = self._addrs[self._at]
            self._at += 1
            family = socket.AF_INET6 if isinstance(addr, IPv6Address) else socket.AF_INET
            self._t0 = perf_counter_ns()
            self.started = self._loop.time()
            try:
                sock = socket.socket(family, socket.SOCK_STREAM)
            except OSError as exc:
                last = refuse_dial(exc, addr, self.port)
                continue
            sock.setblocking(False)
            rc = sock.connect_ex((str(addr), self.port))
            if rc == 0:
                self._sock = sock
                self._connected(addr)
                return
            if rc not in _PENDING:
                sock.close()
                last = refuse_dial(OSError(rc, os.strerror(rc)), addr, self.port)
                continue
            self._sock, self._fd = sock, sock.fileno()
            self._loop.add_writer(self._fd, self._writable)
            return
        assert last is not None, "a dial needs at least one address"
        self._report(last)

    def _writable(self) -> None:
        sock = self._sock
        if sock is None:
            return
        self._loop.remove_writer(self._fd)
        addr = self._addrs[self._at - 1]
        err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            self._sock = None
            sock.close()
            self._try(refuse_dial(OSError(err, os.strerror(err)), addr, self.port))
            return
        self._connected(addr)

    def _connected(self, addr: IPAddress) -> None:
        sock = self._sock
        assert sock is not None
        self._sock = None
        side = Side(self._loop)

        def adopted(err: BaseException | None) -> None:
            if err is not None:
                side.abort()
                self._try(refuse_dial(err, addr, self.port))
                return
            metrics = self.metrics
            if metrics is not None:  # docs/metrics.md: successful connects
                metrics.connect.observe(seconds_since(self._t0))
            self._report((side, addr))

        failed = adopt(self._loop, sock, side, adopted)
        if failed is not None:
            sock.close()
            self._try(refuse_dial(failed, addr, self.port))

    def expire(self) -> None:
        """The connect timeout passed for the current address (the sweeper): the next one."""
        sock = self._sock
        if sock is None or self._done is None:
            return
        self._sock = None
        self._loop.remove_writer(self._fd)
        sock.close()
        addr = self._addrs[self._at - 1]
        self._try(refuse_dial(TimeoutError(), addr, self.port))

    def cancel(self) -> None:
        """Give up now (the proxy is stopping): reported as the dial's failure."""
        if self._done is None:
            return
        sock = self._sock
        if sock is not None:
            self._sock = None
            self._loop.remove_writer(self._fd)
            sock.close()
        self._at = len(self._addrs)
        addr = self._addrs[-1]
        stopping = ConnectionAbortedError(errno.ECONNABORTED, "the proxy is stopping")
        self._report(refuse_dial(stopping, addr, self.port))

    def _report(self, outcome: tuple[Side, IPAddress] | Refuse) -> None:
        done = self._done
        self._done = None
        if done is not None:
            done(outcome)
        elif isinstance(outcome, tuple):
            outcome[0].close()


__all__ = ["Dialed", "Dialer"]

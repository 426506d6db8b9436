"""Dialing a checked address from callbacks, with no task: both drivers' one dial.

Shell. `loop.create_connection` awaited under `asyncio.timeout` needs a task to wait on it.
The executor (`drive/executor.py`) starts every dial here: the callback driver is told of its
end from a callback, the coroutine driver awaits it on a future; the same
`loop.create_connection` (uvloop connects in C and waits once), run by `Stepped`. The addresses
are tried in order; the connect timeout is the sweeper's (`expire`, from `conn.sweep`), so
no timer is armed per dial (docs/proxy.md#limits), and a stopping proxy gives a dial up
(`cancel`), reported as its failure. Metrics: successful connects (docs/metrics.md).
"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Callable, Sequence

from ...policy.target import IPAddress
from ..core.gate import Verdict, refuse_dial
from ..core.record import perf_counter_ns, seconds_since
from ..telemetry.metrics import ProxyMetrics
from .relay import Side
from .stepped import Stepped

Dialed = Callable[["tuple[Side, IPAddress] | Verdict"], None]


class Dialer:
    """One dial in progress: `done((side, addr))` once connected, `done(refusal)` once every
    address failed; called exactly once, from a loop callback (or from `start`)."""

    __slots__ = (
        "_addrs",
        "_at",
        "_done",
        "_loop",
        "_side",
        "_step",
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
        self._side: Side | None = None
        self._step: Stepped | None = None
        self._t0 = 0
        self.started = 0.0  # loop time the current address was tried at (the sweeper's)

    def start(self) -> None:
        self._try(None)

    def _try(self, last: Verdict | None) -> None:
        """Connect to the next address; report `last` when none is left."""
        if self._at >= len(self._addrs):
            assert last is not None, "a dial needs at least one address"
            self._report(last)
            return
        addr = self._addrs[self._at]
        self._at += 1
        self._t0 = perf_counter_ns()
        self.started = self._loop.time()
        side = self._side = Side(self._loop)
        coro = self._loop.create_connection(lambda: side, str(addr), self.port)
        step = self._step = Stepped(self._loop, coro, self._outcome)
        step.start()

    def _outcome(self, _: object, err: BaseException | None) -> None:
        self._step = None
        addr = self._addrs[self._at - 1]
        if err is not None:
            self._try(refuse_dial(err, addr, self.port))
            return
        side = self._side
        assert side is not None
        metrics = self.metrics
        if metrics is not None:  # docs/metrics.md: successful connects
            metrics.connect.observe(seconds_since(self._t0))
        self._report((side, addr))

    def expire(self) -> None:
        """The connect timeout passed for the current address (the sweeper): the next one."""
        if self._stop_step():
            self._try(refuse_dial(TimeoutError(), self._addrs[self._at - 1], self.port))

    def cancel(self) -> None:
        """Give up now (the proxy is stopping): reported as the dial's failure."""
        if not self._stop_step():
            return
        self._at = len(self._addrs)
        stopping = ConnectionAbortedError(errno.ECONNABORTED, "the proxy is stopping")
        self._report(refuse_dial(stopping, self._addrs[-1], self.port))

    def _stop_step(self) -> bool:
        """Cancel the connect in flight; False if none is (the dial already ended, or its
        outcome is being reported), and then there is nothing to do."""
        step = self._step
        if step is None or self._done is None:
            return False
        self._step = None
        step.cancel()
        return True

    def _report(self, outcome: tuple[Side, IPAddress] | Verdict) -> None:
        done, self._done = self._done, None
        if done is not None:
            done(outcome)


__all__ = ["Dialed", "Dialer"]

"""`Sweeper`: the proxy's timeouts without a timer per operation, a component of `EgressProxy`.

Shell. One task wakes once per `tick` (a quarter of the shortest timeout, between 0.05 and
1 s) and enforces every deadline at once (docs/proxy.md#limits): head, idle and connect
timeouts (`net/conn.sweep`), `progress` and late `open` records of long exchanges
(docs/audit-log.md#open-and-progress), unidentified connections past `identify_timeout`,
expired fair-share turns, the refusal tally's ended seconds, the upstream pool's idle
connections; and every 30 s it re-reads the host's own addresses (docs/proxy.md, the guard's
`host_local`). So the hot path arms no timer. Handed the open connections, the running
parts and the re-read as a callable, never the proxy; it owns its task.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from .net.conn import Conn, Limits, sweep
from .net.pool import UpstreamPool
from .runtime import Steps

REFRESH_EVERY = 30.0  # seconds between re-reads of the host's addresses (docs/proxy.md)


class Sweeper:
    """The task that enforces the proxy's timeouts."""

    def __init__(
        self,
        conns: set[Conn],
        steps: Steps,
        pool: UpstreamPool,
        limits: Limits,
        refresh: Callable[[], Awaitable[None]],
    ) -> None:
        self.conns = conns
        self.steps = steps
        self.pool = pool
        self.limits = limits
        self.refresh = refresh
        self.task: asyncio.Task[None] | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.task = loop.create_task(self._run(loop), name="egress-sweeper")

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    def tick(self) -> float:
        """Seconds between sweeps: a quarter of the shortest deadline, within 0.05-1 s."""
        lim = self.limits
        lifecycle = self.steps.lifecycle
        interim = lifecycle.interim_interval if lifecycle is not None else lim.idle_timeout
        shortest = min(lim.head_timeout, lim.idle_timeout, lim.connect_timeout, interim)
        return max(0.05, min(1.0, shortest / 4))

    async def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        tick = self.tick()
        next_refresh = loop.time() + REFRESH_EVERY
        while True:
            await asyncio.sleep(tick)
            now = loop.time()
            self.sweep(now)
            if now >= next_refresh:
                next_refresh = now + REFRESH_EVERY
                with contextlib.suppress(Exception):
                    await self.refresh()

    def sweep(self, now: float) -> None:
        """One sweep: every deadline that has passed by `now`."""
        lim, steps = self.limits, self.steps
        for conn in list(self.conns):
            sweep(conn, now, lim)
            if conn.rec is not None:  # docs/audit-log.md#open-and-progress
                steps.progress(conn, now)
        steps.overdue(now)
        steps.turns.expire(now)
        steps.flush_refusals()
        self.pool.sweep(now)


__all__ = ["Sweeper"]

"""The upstream connection pool: dialing checked addresses, and idle keep-alive reuse.

Shell. Like httpcore's connection pool, keyed by what was *checked*: the (address, port) the
gate admitted, never the name, so a pooled connection is only reused for a request that was
itself judged and resolved to that address (docs/architecture.md#one-request). Bounds:
`per_key` idle connections per key and `max_idle` in all (they count in the descriptor
budget, `fdbudget.py`), each closed after `idle` seconds (the server's sweeper calls `sweep`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from ...policy.target import IPAddress
from ..core.gate import Refuse, refuse_dial
from ..core.record import perf_counter_ns, seconds_since
from ..telemetry.metrics import ProxyMetrics
from .relay import Side


class UpstreamPool:
    """Idle upstream `Side`s by (address, port), and the dialer that makes new ones."""

    __slots__ = (
        "_held",
        "_idle",
        "_loop",
        "closing",
        "connect_timeout",
        "idle",
        "max_idle",
        "metrics",
        "per_key",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        connect_timeout: float,
        idle: float,
        per_key: int,
        max_idle: int = 256,
    ) -> None:
        self._loop = loop
        self.metrics: ProxyMetrics | None = None  # set by the proxy (docs/metrics.md)
        self._idle: dict[tuple[IPAddress, int], list[Side]] = {}
        self.connect_timeout = connect_timeout
        self.idle = idle
        self.per_key = per_key
        self.max_idle = max_idle
        self._held = 0  # idle connections in all
        self.closing = False

    async def connect(
        self, addrs: Sequence[IPAddress], port: int
    ) -> tuple[Side, IPAddress] | Refuse:
        """Connect to the first reachable checked address; the last failure's `Refuse` when
        none answered (an action's outcome, not an exception: docs/architecture.md)."""
        loop = self._loop
        last: Refuse | None = None
        metrics = self.metrics
        for addr in addrs:
            t0 = perf_counter_ns()
            try:
                async with asyncio.timeout(self.connect_timeout):
                    _, side = await loop.create_connection(lambda: Side(loop), str(addr), port)
                if metrics is not None:  # docs/metrics.md: successful connects
                    metrics.connect.observe(seconds_since(t0))
                return side, addr
            except OSError as exc:  # TimeoutError and ConnectionRefusedError included
                last = refuse_dial(exc, addr, port)
        assert last is not None, "connect() needs at least one address"
        return last

    def take_idle(self, addrs: Sequence[IPAddress], port: int) -> tuple[Side, IPAddress] | None:
        """An idle pooled connection to one of the checked `addrs`, or None (no waiting)."""
        for addr in addrs:
            idle = self._idle.get((addr, port))
            while idle:
                side = idle.pop()
                self._held -= 1
                t = side.transport
                if not side.eof and not side.buf and t is not None and not t.is_closing():
                    return side, addr
                side.close()
        return None

    def release(self, upstream: Side, ip: IPAddress, port: int) -> None:
        """Keep `upstream` for reuse if it is clean and there is room, else close it."""
        if upstream.eof or upstream.buf or self.closing:
            upstream.close()
            return
        idle = self._idle.setdefault((ip, port), [])
        if len(idle) >= self.per_key or self._held >= self.max_idle:
            upstream.close()
            return
        idle.append(upstream)
        self._held += 1

    def revoke(self, gone: Callable[[Side], bool]) -> list[Side]:
        """Close the idle connections `gone` says a policy change took away (it is given each
        one, `Side.last_rec` names the exchange it carried last); returns them, for the records
        (docs/policy.md#live-policy-changes)."""
        closed: list[Side] = []
        for key, sides in list(self._idle.items()):
            keep: list[Side] = []
            for side in sides:
                (closed if gone(side) else keep).append(side)
            if len(keep) == len(sides):
                continue
            self._held -= len(sides) - len(keep)
            if keep:
                self._idle[key] = keep
            else:
                del self._idle[key]
        for side in closed:
            side.close()
        return closed

    def sweep(self, now: float) -> None:
        """Close idle connections that saw EOF or sat unused for longer than `idle`."""
        for key, sides in list(self._idle.items()):
            keep = []
            for side in sides:
                if side.eof or now - side.last_active > self.idle:
                    side.close()
                else:
                    keep.append(side)
            self._held -= len(sides) - len(keep)
            if keep:
                self._idle[key] = keep
            else:
                del self._idle[key]

    def close(self) -> None:
        self.closing = True
        for sides in self._idle.values():
            for side in sides:
                side.close()
        self._idle.clear()
        self._held = 0


__all__ = ["UpstreamPool"]

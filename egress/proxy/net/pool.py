"""The upstream connection pool: idle keep-alive reuse of dialed upstreams (`net/dialer.py`).

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
from .relay import Side


class UpstreamPool:
    """Idle upstream `Side`s by (address, port); new ones are dialed by `Dialer`."""

    __slots__ = (
        "_held",
        "_idle",
        "_loop",
        "closing",
        "idle",
        "max_idle",
        "per_key",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        idle: float,
        per_key: int,
        max_idle: int = 256,
    ) -> None:
        self._loop = loop
        self._idle: dict[tuple[IPAddress, int], list[Side]] = {}
        self.idle = idle
        self.per_key = per_key
        self.max_idle = max_idle
        self._held = 0  # idle connections in all
        self.closing = False

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

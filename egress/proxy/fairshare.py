"""A fair share of the proxy: at most `max_client_inflight` requests of one client at once.

Shell (futures). Why (docs/proxy.md#fair-share): one event loop serves every sandbox, and it
runs ready callbacks first come, first served, so a sandbox with 250 connections of
back-to-back GETs got 250 turns for every one of another sandbox's, and raised the other 49
sandboxes' p99 from 2.9 ms to 331 ms. Each client (client id, else source address: the
connection's `owner`) may have at most `cap` forward-proxy requests between their verdict
(after DNS, so a name that never resolves holds no slot) and their record; the next waits,
first in first out per client, and takes over a slot of its own client the moment one is
given back. So whatever one client sends, each loop turn carries at most `cap` of its
requests, and every other client's requests are served round-robin beside them (the cap
bounds a client's share, the loop interleaves the rest).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Hashable


class Turns:
    """Requests in flight per client (see the module docstring)."""

    __slots__ = ("_active", "_waiting", "cap", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, cap: int | None) -> None:
        self.loop = loop
        self.cap = cap  # None: no cap
        self._active: dict[Hashable, int] = {}
        self._waiting: dict[Hashable, deque[asyncio.Future[None]]] = {}

    def try_take(self, owner: Hashable) -> bool:
        """Take a slot of `owner` if one is free and nobody of `owner` waits (no waiting)."""
        cap = self.cap
        n = self._active.get(owner, 0)
        if cap is not None and (n >= cap or owner in self._waiting):
            return False
        self._active[owner] = n + 1
        return True

    async def take(self, owner: Hashable) -> None:
        """Take a slot of `owner`, waiting for one of its own to be given back."""
        if self.try_take(owner):
            return
        fut: asyncio.Future[None] = self.loop.create_future()
        self._waiting.setdefault(owner, deque()).append(fut)
        try:
            await fut  # given a slot by `give_back`
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.give_back(owner)  # handed over just as we were cancelled: pass it on
            else:
                self._forget(owner, fut)
            raise

    def give_back(self, owner: Hashable) -> None:
        """A request of `owner` ended: its slot goes to the next waiter of `owner`, if any."""
        waiting = self._waiting.get(owner)
        while waiting:
            fut = waiting.popleft()
            if not waiting:
                del self._waiting[owner]
            if not fut.done():
                fut.set_result(None)
                return
            waiting = self._waiting.get(owner)
        n = self._active.get(owner, 0) - 1
        if n > 0:
            self._active[owner] = n
        else:
            self._active.pop(owner, None)

    def in_flight(self, owner: Hashable) -> int:
        return self._active.get(owner, 0)

    def _forget(self, owner: Hashable, fut: asyncio.Future[None]) -> None:
        waiting = self._waiting.get(owner)
        if waiting is not None and fut in waiting:
            waiting.remove(fut)
            if not waiting:
                del self._waiting[owner]


__all__ = ["Turns"]

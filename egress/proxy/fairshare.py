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
bounds a client's share, the loop interleaves the rest). A request that has held its slot
for a second (`LONG`: a long poll, a streamed body; its cost is then bytes under flow
control, not turns) stops counting, so long requests never hold a client's short ones back.

The cap applies only while another client is present (`crowded`: it holds a connection, or
let go of its last one less than a second ago; admission.py): a client alone has nobody to be
fair to, so it gets as many requests in flight as it sends (the cap cost a lone client half
its throughput). When another client comes, the one over its share takes no new slot until
it is back under the cap: each request of its that ends frees a slot without passing it on,
so within one round of its requests in flight it is held to its share, while the newcomer's
requests take slots of their own at once (the queues are per client, so a newcomer never
waits behind another client's queue). When the others are gone, the next request of its that
ends lets all of its waiting requests go.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Hashable
from typing import Final

# a request that has held its slot this long is a long one (a long poll, a streamed body):
# it stops counting, so a client's long requests never hold its short ones back
LONG: Final = 1.0


class Ticket:
    """One request's slot; `live` until given back or expired as long."""

    __slots__ = ("live", "owner", "since")

    def __init__(self, owner: Hashable, since: float) -> None:
        self.owner = owner
        self.since = since
        self.live = True


class Waiter:
    """A callback waiting for a slot (the callback fast path's, `drive/callback.py`): it waits in
    the same first-in-first-out queue as `Turns.take`'s coroutines."""

    __slots__ = ("owner", "then", "turns")

    def __init__(self, turns: Turns, owner: Hashable, then: Callable[[Ticket], None]) -> None:
        self.turns = turns
        self.owner = owner
        self.then: Callable[[Ticket], None] | None = then

    def run(self, ticket: Ticket) -> None:
        then, self.then = self.then, None
        if then is None:  # cancelled after the slot was handed over: pass it on
            self.turns.give_back(ticket)
        else:
            then(ticket)

    def cancel(self) -> None:
        """Stop waiting (its connection went away)."""
        if self.then is not None:
            self.then = None
            self.turns._forget(self.owner, self)


class Turns:
    """Requests in flight per client (see the module docstring)."""

    __slots__ = ("_active", "_held", "_waiting", "cap", "crowded", "long", "loop")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        cap: int | None,
        crowded: Callable[[Hashable, float], bool] | None = None,
    ) -> None:
        self.loop = loop
        self.cap = cap  # None: no cap
        # whether a client other than the one given is present at a loop time: the cap
        # applies only then (the module docstring); None: always
        self.crowded = crowded
        self.long = LONG
        self._active: dict[Hashable, int] = {}
        self._held: dict[Hashable, deque[Ticket]] = {}  # live tickets, oldest first
        self._waiting: dict[Hashable, deque[asyncio.Future[Ticket] | Waiter]] = {}

    def try_take(self, owner: Hashable) -> Ticket | None:
        """A slot of `owner` if one is free and nobody of `owner` waits (no waiting)."""
        cap = self.cap
        n = self._active.get(owner, 0)
        if cap is not None and (owner in self._waiting or (n >= cap and self._capped(owner))):
            return None
        self._active[owner] = n + 1
        return self._ticket(owner)

    async def take(self, owner: Hashable) -> Ticket:
        """A slot of `owner`, waiting for one of its own to be given back."""
        ticket = self.try_take(owner)
        if ticket is not None:
            return ticket
        fut: asyncio.Future[Ticket] = self.loop.create_future()
        self._waiting.setdefault(owner, deque()).append(fut)
        try:
            return await fut  # handed over by `give_back` or `expire`
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.give_back(fut.result())  # handed over as we were cancelled: pass it on
            else:
                self._forget(owner, fut)
            raise

    def wait(self, owner: Hashable, then: Callable[[Ticket], None]) -> Waiter:
        """`then(ticket)`, from a loop callback, once a slot of `owner` is handed to it (in
        turn with `take`'s waiters); call this when `try_take` gave none."""
        waiter = Waiter(self, owner, then)
        self._waiting.setdefault(owner, deque()).append(waiter)
        return waiter

    def give_back(self, ticket: Ticket) -> None:
        """A request ended: its slot (unless already expired) goes to the next waiter of
        its client, if any. The given-back tickets at the head of the client's queue are
        dropped now, not at the sweeper's next tick: a client's requests mostly end in the
        order they began, so its queue holds its requests in flight only, and a ticket dies
        young (by reference counting) instead of outliving the collector's young generation
        (docs/proxy.md#garbage-collection)."""
        if ticket.live:
            ticket.live = False
            owner = ticket.owner
            held = self._held.get(owner)
            if held is not None:
                while held and not held[0].live:
                    held.popleft()
            self._release(owner)

    def expire(self, now: float) -> None:
        """Requests that have held their slot for `long` seconds stop counting (the sweeper
        calls this)."""
        after = self.long
        for owner, held in list(self._held.items()):
            while held and (not held[0].live or now - held[0].since > after):
                ticket = held.popleft()
                if ticket.live:
                    ticket.live = False
                    self._release(owner)
            if not held and self._held.get(owner) is held:
                del self._held[owner]

    def in_flight(self, owner: Hashable) -> int:
        return self._active.get(owner, 0)

    def waiting(self, owner: Hashable) -> int:
        """Requests of `owner` waiting for a slot."""
        return len(self._waiting.get(owner, ()))

    def held(self, owner: Hashable) -> int:
        """Tickets of `owner` kept (in flight, or given back behind one in flight)."""
        return len(self._held.get(owner, ()))

    def _ticket(self, owner: Hashable) -> Ticket:
        ticket = Ticket(owner, self.loop.time())
        self._held.setdefault(owner, deque()).append(ticket)
        return ticket

    def _capped(self, owner: Hashable) -> bool:
        """Whether `owner`'s requests are held to the cap now (another client is present)."""
        crowded = self.crowded
        return crowded is None or crowded(owner, self.loop.time())

    def _release(self, owner: Hashable) -> None:
        """One of `owner`'s slots is free: it passes on to the next waiter of its client,
        unless the client is over its share (it was alone, another came: the slot is let go)
        or alone (then every waiter goes)."""
        n = self._active.get(owner, 0) - 1
        waiting = self._waiting.get(owner)
        if waiting:
            cap = self.cap
            free = 1 << 62 if cap is None or not self._capped(owner) else cap - n
            while waiting and free > 0:
                fut = waiting.popleft()
                if isinstance(fut, Waiter):
                    if fut.then is None:
                        continue
                    self.loop.call_soon(fut.run, self._ticket(owner))  # on the next turn
                elif fut.done():
                    continue
                else:
                    fut.set_result(self._ticket(owner))
                n += 1
                free -= 1
            if not waiting:
                del self._waiting[owner]
        if n > 0:
            self._active[owner] = n
        else:
            self._active.pop(owner, None)

    def _forget(self, owner: Hashable, fut: asyncio.Future[Ticket] | Waiter) -> None:
        waiting = self._waiting.get(owner)
        if waiting is not None and fut in waiting:
            waiting.remove(fut)
            if not waiting:
                del self._waiting[owner]


__all__ = ["LONG", "Ticket", "Turns", "Waiter"]

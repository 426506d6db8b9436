"""Connection slots: which client holds which of the proxy's connections, from `accept` on.

Pure (no sockets, no clock: callers pass loop time). Why it exists (docs/proxy.md#limits):
counting a connection against its client only once its first request is identified let one
sandbox hold every slot with connections that never send a byte. So:

- a connection whose client the listener already knows (a sandbox's own listener, a
  transparent or DNS listener, a source address that maps to one client) is counted in that
  client's cap (`client_cap`) from the moment it is accepted;
- a connection on a shared listener whose client only its first request will name (tokens,
  `--require-auth`) is *unidentified*: it takes a slot from a small budget of its source
  address (`unidentified_per_source`) and from a total budget (`unidentified_total`, at most
  a quarter of `max_connections`), so unidentified connections can never fill the proxy.
  When a budget is full the oldest unidentified connection of that source (or, for the total
  budget, of the source holding most) is evicted to make room: on loopback every sandbox is
  127.0.0.1, and a client that identifies at once must still get in. The shell also closes
  unidentified connections after `identify_timeout`;
- at the global cap a newcomer may take the place of an unidentified connection, or of its
  *own* client's longest-idle kept-alive connection (the shell picks it from `members`),
  never of another client's.

It also says who is *present* (`others_present`), for the fair share (fairshare.py,
docs/proxy.md#fair-share): a client holding a connection, or whose last one closed less than
`PRESENT_FOR` seconds ago. A client that opens a connection per request is gone between its
requests, and must not find a lone client's uncapped flood ahead of it when it comes back:
with a window of one second, a client asking every second or two always found the flooder
alone and uncapped (its p50 went from 2.0 to 24.6-30.5 ms, issue 32), so the window is as
long as an agent's pause between tool calls.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

from ..reasons import Reason
from .core.gate import Verdict

C = TypeVar("C", bound=Hashable)
Owner = Hashable  # a client id (str), or ("source", ip) for the default client

GLOBAL_FULL: Final = Verdict(Reason.TOO_MANY_CONNECTIONS, "connection limit reached")
CLIENT_FULL: Final = Verdict(Reason.TOO_MANY_CONNECTIONS, "per-client connection limit reached")
# a client stays present this long after its last connection closed (`others_present`): an
# occasional client (an agent between tool calls) still holds a flood to its share
PRESENT_FOR: Final = 30.0


@dataclass(frozen=True, slots=True)
class Budget:
    """The numbers `Slots` enforces (from `Limits`, docs/proxy.md#limits)."""

    max_connections: int
    client_cap: int
    unidentified_per_source: int
    unidentified_total: int


@dataclass(frozen=True, slots=True)
class Admitted(Generic[C]):
    """Serve the new connection; close `evicted` first (unidentified ones, oldest first)."""

    evicted: tuple[C, ...] = ()


class Slots(Generic[C]):
    """Who holds which connection (see the module docstring)."""

    __slots__ = (
        "_left",
        "_left_at",
        "_left_before",
        "_owned",
        "_since",
        "_unknown",
        "_where",
        "budget",
        "present_for",
        "total",
        "unidentified",
    )

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self._owned: dict[Owner, dict[C, None]] = {}  # insertion order = accept order
        self._unknown: dict[str, dict[C, None]] = {}  # unidentified, per source
        self._where: dict[C, tuple[bool, Owner]] = {}  # conn -> (owned?, owner or source)
        self._since: dict[C, float] = {}  # unidentified: accepted at (loop time)
        self.total = 0
        self.unidentified = 0
        self.present_for = PRESENT_FOR
        # the client that let go of its last connection most recently, when, and when the
        # most recent other one did: enough to say whether a client other than a given one
        # left within `present_for`, in O(1) (`others_present`)
        self._left: Owner | None = None
        self._left_at = float("-inf")
        self._left_before = float("-inf")

    # --- accept ------------------------------------------------------------------------------
    def admit(
        self, conn: C, owner: Owner | None, source: str, now: float, *, reclaimable: bool = False
    ) -> Admitted[C] | Verdict:
        """A new connection: `owner` when the listener knows its client, else None.

        `reclaimable`: the shell found an idle kept-alive connection of the same owner that
        it will close if the global cap is reached (it is then not counted here)."""
        b = self.budget
        if owner is not None:
            held = self._owned.get(owner)
            if held is not None and len(held) >= b.client_cap:
                return CLIENT_FULL
            evicted: tuple[C, ...] = ()
            if self.total >= b.max_connections and not reclaimable:
                unknown = self._largest_unknown()
                if unknown is None:
                    return GLOBAL_FULL
                evicted = (unknown,)
                self._drop(unknown)
            self._owned.setdefault(owner, {})[conn] = None
            self._where[conn] = (True, owner)
            self.total += 1
            return Admitted(evicted)
        victim: C | None = None
        mine = self._unknown.get(source)
        if mine is not None and len(mine) >= b.unidentified_per_source:
            victim = self._oldest(mine)
        elif self.unidentified >= b.unidentified_total or self.total >= b.max_connections:
            victim = self._largest_unknown()
        if self.total - (victim is not None) >= b.max_connections:
            return GLOBAL_FULL
        if victim is not None:
            self._drop(victim)
        self._unknown.setdefault(source, {})[conn] = None
        self._where[conn] = (False, source)
        self._since[conn] = now
        self.total += 1
        self.unidentified += 1
        return Admitted(() if victim is None else (victim,))

    def over_cap(self, owner: Owner) -> Verdict | None:
        """`CLIENT_FULL` when `owner` already holds its cap: what `admit` would answer,
        known from the owner alone, so the shell can refuse before it builds anything."""
        held = self._owned.get(owner)
        if held is not None and len(held) >= self.budget.client_cap:
            return CLIENT_FULL
        return None

    # --- identification ----------------------------------------------------------------------
    def identify(self, conn: C, owner: Owner) -> Verdict | None:
        """`conn`'s first request named its client: count it there (or move it from the
        client the source address suggested). A refusal leaves it where it was."""
        where = self._where.get(conn)
        if where is None:
            return None
        owned, key = where
        if owned and key == owner:
            return None
        held = self._owned.get(owner)
        if held is not None and len(held) >= self.budget.client_cap:
            return CLIENT_FULL
        self._drop(conn)
        self._owned.setdefault(owner, {})[conn] = None
        self._where[conn] = (True, owner)
        self.total += 1
        return None

    def owner(self, conn: C) -> Owner | None:
        """The client `conn` is counted for, or None while unidentified (or not held)."""
        where = self._where.get(conn)
        return where[1] if where is not None and where[0] else None

    def members(self, owner: Owner) -> Iterable[C]:
        """`owner`'s connections, oldest first."""
        return tuple(self._owned.get(owner, ()))

    def count(self, owner: Owner) -> int:
        return len(self._owned.get(owner, ()))

    def overdue(self, now: float, timeout: float) -> list[C]:
        """Unidentified connections accepted more than `timeout` seconds before `now`."""
        return [c for c, t in self._since.items() if now - t > timeout]

    # --- the end -----------------------------------------------------------------------------
    def release(self, conn: C, now: float | None = None) -> None:
        """`conn` closed (at loop time `now`, if known): its slot is free. Idempotent."""
        where = self._where.get(conn)
        self._drop(conn)
        if now is not None and where is not None and where[0] and where[1] not in self._owned:
            owner = where[1]  # its last connection: present for `present_for` more
            if owner != self._left:
                self._left_before = self._left_at
                self._left = owner
            self._left_at = now

    # --- presence (the fair share's) -----------------------------------------------------
    def others_present(self, owner: Owner, now: float) -> bool:
        """Whether a client other than `owner` is present at `now`: holds a connection, or
        let go of its last one less than `present_for` seconds ago. Unidentified connections
        do not count: they carry no request until their first one names their client, and
        from then on that client is present."""
        owned = self._owned
        n = len(owned)
        if n > 1 or (n == 1 and owner not in owned):
            return True
        left = self._left_before if owner == self._left else self._left_at
        return now - left < self.present_for

    def _drop(self, conn: C) -> None:
        where = self._where.pop(conn, None)
        if where is None:
            return
        owned, key = where
        if owned:
            group = self._owned[key]
            del group[conn]
            if not group:
                del self._owned[key]
        else:
            unknown = self._unknown[str(key)]
            del unknown[conn]
            if not unknown:
                del self._unknown[str(key)]
            del self._since[conn]
            self.unidentified -= 1
        self.total -= 1

    def _oldest(self, group: dict[C, None]) -> C:
        return next(iter(group))

    def _largest_unknown(self) -> C | None:
        """The oldest unidentified connection of the source holding most of them."""
        if not self._unknown:
            return None
        return self._oldest(max(self._unknown.values(), key=len))


__all__ = ["CLIENT_FULL", "GLOBAL_FULL", "PRESENT_FOR", "Admitted", "Budget", "Owner", "Slots"]

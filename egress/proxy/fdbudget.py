"""The descriptor budget: the connection cap must fit `RLIMIT_NOFILE`.

See docs/proxy.md#file-descriptors.

Pure (the shell reads and sets the limit). Why: when the process runs out of descriptors,
`accept` fails where the proxy cannot answer: uvloop (libuv) accepts and closes such
connections at once with no record and no log line, and the stock asyncio loop logged a
traceback per failed `accept`, about a million in 40 s. A cap the descriptors can always
honour turns the same load into answered, recorded 503s. So at start:

- what the cap needs: each client connection may hold an upstream connection (2 per slot),
  idle pooled upstream connections (`pool_max_idle`), the admin endpoint's connections, the
  listening sockets, the connections accepted in one burst before they are admitted or
  refused (one listen backlog) and the process's own (`FIXED`);
- the soft limit is raised to that (up to the hard limit) when it is lower;
- when even the hard limit is too low, `max_connections` is lowered to what fits (counting
  `SCARCE_BURST` accepted connections instead of a whole backlog), and the plan says so in
  one line. The listen backlog itself keeps its length: connections waiting in the kernel's
  queue hold none of our descriptors, and a short queue overflows under a burst, the kernel
  drops the SYNs and those clients wait for their retransmits (1, 3, 7, 15, 31 s) with no
  answer; the accept loop takes `BATCH` at a time and refuses at once what the cap refuses.

`AcceptFailures` keeps a failing `accept` to one log line per second, with a count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

FIXED: Final = 48  # stdio, the loop's epoll and self-pipe, the audit log, resolver, ...
LISTENERS: Final = 64  # listening sockets allowed for: those given at start, sandboxes' own
SCARCE_BURST: Final = 16  # accepted connections allowed for in a burst when descriptors are scarce


@dataclass(frozen=True, slots=True)
class FdPlan:
    """What to do at start: `soft` (the soft limit to set, unchanged if it was that),
    `max_connections` and the listen `backlog` to use (never shortened: a short one drops
    SYNs), and `note` to say, if anything."""

    soft: int
    max_connections: int
    backlog: int
    note: str | None = None


def pool_max_idle(max_connections: int) -> int:
    """Idle upstream connections kept in all (docs/proxy.md#limits): a quarter of the cap."""
    return max(1, max_connections // 4)


def fds_needed(max_connections: int, backlog: int, admin: int) -> int:
    """Descriptors the proxy may hold at once with this cap, backlog and admin limit."""
    burst = LISTENERS + backlog  # one listener's burst at a time: refused in the same step
    return 2 * max_connections + pool_max_idle(max_connections) + admin + burst + FIXED


def plan_fds(max_connections: int, backlog: int, admin: int, soft: int, hard: int | None) -> FdPlan:
    """The plan for a soft and hard `RLIMIT_NOFILE` (`hard` None = unlimited)."""
    need = fds_needed(max_connections, backlog, admin)
    if need <= soft:
        return FdPlan(soft, max_connections, backlog)
    if hard is None or need <= hard:
        return FdPlan(need, max_connections, backlog)
    top = hard
    small = min(backlog, SCARCE_BURST)
    room = top - fds_needed(0, small, admin)
    fit = max(1, room * 4 // 9)  # 2 per slot plus a quarter for the pool
    while fit > 1 and fds_needed(fit, small, admin) > top:
        fit -= 1
    while fds_needed(fit + 1, small, admin) <= top:
        fit += 1
    note = (
        f"the file descriptor limit ({top}) is too low for max_connections "
        f"{max_connections} (it needs {need}): serving at most {fit} connections "
        f"(raise it with `ulimit -n {need}` or LimitNOFILE={need})"
    )
    return FdPlan(top, fit, backlog, note)


class AcceptFailures:
    """A failing `accept` (no descriptors left) logged at most once per `every` seconds,
    with the count of failures since the last line."""

    __slots__ = ("_count", "_last", "every")

    def __init__(self, every: float = 1.0) -> None:
        self.every = every
        self._count = 0
        self._last: float | None = None

    def failed(self, now: float) -> int | None:
        """One more failure at `now`: the count to log now, or None (not yet)."""
        self._count += 1
        if self._last is not None and now - self._last < self.every:
            return None
        self._last = now
        count, self._count = self._count, 0
        return count


__all__ = [
    "FIXED",
    "SCARCE_BURST",
    "AcceptFailures",
    "FdPlan",
    "fds_needed",
    "plan_fds",
    "pool_max_idle",
]

"""The garbage collector of a proxy serving hundreds of sandboxes: no long pauses.

Why: CPython's full (generation 2) collection walks every object the collector tracks, and
stops the event loop while it does. With 400 sandboxes (their clients, policies, listeners
and connections) and the modules of a real application, a full collection took 74-78 ms, in
the middle of the data path (docs/benchmarks.md#hundreds-of-sandboxes). What lives as long as
the proxy, or as long as a sandbox, is not garbage, and need not be walked again and again:

- after start-up, what there is (modules, the policy, the proxy) is moved out of the
  collector's sight (`gc.freeze()`); after each burst of prepares (once none is in flight),
  the youngest generation is collected, then everything is frozen. Frozen objects are still
  freed by reference counting as usual. The settle collects the youngest generation only:
  a full collection of what the burst made took 11-24 ms of CPU after 400 prepares, and
  found nothing once prepares, releases and closed connections stopped leaving cycles
  (a listener lets go of its acceptor when closed, a closed connection's side of its
  `Conn`: tests/integration/test_gc_pauses.py); a cycle that died young is found, and one
  that outlived a young collection waits for a compaction.
- Cycles among frozen objects that became garbage later are only found by a *compaction*
  (unfreeze, full collection, freeze again), one pause the size of the whole heap (66 ms of
  CPU at 400 sandboxes). Since churn leaves no cycle, the frozen set grows with what is
  alive, and a compaction runs at a burst's end only once the frozen set has grown `GROWTH`
  times since the last one: a backstop that bounds memory if something else leaves cycles
  behind, without compacting because sandboxes were added (the first burst of 400
  sandboxes about doubles a proxy's objects; with a factor of 2 that was the 66 ms pause).
- the first threshold is raised from 700 to `YOUNG`: most objects of a request die by
  reference counting before any collection, so fewer, slightly larger young collections
  cost less in all, and a young collection of `YOUNG` objects takes well under a millisecond.

The collector is the process's: `EgressProxy(tune_gc=False)` leaves it alone (an embedding
application with its own settings), docs/proxy.md#garbage-collection. The previous
thresholds come back when the last proxy that tuned them stops.
"""

from __future__ import annotations

import asyncio
import gc
import time

SETTLE_AFTER = 0.05  # seconds without a prepare in flight: the burst has ended
YOUNG = 5_000  # first threshold (CPython's default: 700)
OLDER = (20, 20)  # second and third thresholds (default: 10, 10)
GROWTH = 4  # compact once the frozen set is this many times the last compaction's

_users = 0  # proxies that tuned the thresholds and have not stopped yet
_saved: tuple[int, int, int] | None = None


class Heap:
    """When to collect and freeze: at start-up and at the end of each prepare burst.

    The boundary calls `enter`/`leave` around each prepare; the last `leave`
    of a burst settles the heap (`settle`). Not thread-safe: the proxy's loop calls it.
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.in_flight = 0
        self.base = 0  # frozen objects after the last compaction
        self.settled = 0  # how many times the heap was settled (for tests and the bench)
        self.compactions = 0
        self.longest_ms = 0.0  # the longest settle: the one pause this class makes itself
        self.longest_cpu_ms = 0.0  # its CPU time (the wall time includes being preempted)
        self.last_compaction_ms = 0.0
        self.garbage = 0  # unreachable objects settles and compactions found (cycles)
        self._tuned = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None

    def started(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start-up done: tune the thresholds and freeze what there is (what an earlier proxy
        froze stays frozen: no full walk for every proxy of a process)."""
        global _users, _saved
        if not self.enabled or self._tuned:
            return
        self._loop = loop
        if _users == 0:
            _saved = gc.get_threshold()
            gc.set_threshold(YOUNG, *OLDER)
        _users += 1
        self._tuned = True
        gc.freeze()  # no collection first: start-up stays pause-free (the next compaction
        # finds what garbage was frozen with it)
        self.base = gc.get_freeze_count()
        self.settled += 1

    def stopped(self) -> None:
        """The proxy stopped: the thresholds it set are restored when no other proxy runs."""
        global _users, _saved
        if not self._tuned:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._tuned = False
        _users -= 1
        if _users == 0 and _saved is not None:
            gc.set_threshold(*_saved)
            _saved = None

    def enter(self) -> None:
        self.in_flight += 1
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def leave(self) -> None:
        """One prepare ended; when none has been in flight for `SETTLE_AFTER`
        seconds, the burst has ended and the heap is settled (not in the last call's time)."""
        self.in_flight -= 1
        if self.in_flight == 0 and self._tuned and self._loop is not None:
            self._timer = self._loop.call_later(SETTLE_AFTER, self._quiet)

    def _quiet(self) -> None:
        self._timer = None
        if self.in_flight == 0 and self._tuned:
            self.settle()

    def settle(self) -> None:
        """Collect the youngest generation, then freeze everything (compact when the
        frozen set has grown `GROWTH` times since the last compaction)."""
        if gc.get_freeze_count() > GROWTH * self.base:
            self.compact()
            return
        start = time.perf_counter(), time.thread_time()
        self.garbage += gc.collect(0)
        gc.freeze()
        self._took(start)

    def compact(self) -> None:
        start = time.perf_counter(), time.thread_time()
        gc.unfreeze()
        self.garbage += gc.collect()
        gc.freeze()
        self.base = gc.get_freeze_count()
        self.compactions += 1
        self.last_compaction_ms = self._took(start)

    def _took(self, start: tuple[float, float]) -> float:
        self.settled += 1
        wall = (time.perf_counter() - start[0]) * 1000
        self.longest_ms = max(self.longest_ms, wall)
        self.longest_cpu_ms = max(self.longest_cpu_ms, (time.thread_time() - start[1]) * 1000)
        return wall

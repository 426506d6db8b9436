"""A data path without pauses (issue 23): the proxy keeps its long-lived objects, and those of
the sandboxes a prepare burst made, out of the collector's sight, so a full collection walks
only what is young (docs/proxy.md#garbage-collection). Before, a full collection walked the
whole heap: 74-78 ms at 400 sandboxes.

CI-sized: a burst of sandboxes (real namespaces, the real API, netcut's real workers), then
the heap a full collection walks is measured with `gc.get_objects()` (which leaves the frozen
objects out), and the churn of a few cycles keeps the frozen set bounded. The full scale run
is `bench/scale.py`.
"""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import subprocess
import sys
import time
import weakref

import pytest

from egress import EgressProxy, Policy, build_settings, prepare_execution, release_execution
from egress.proxy import heap
from egress.proxy.endpoints import ClientSide
from egress.proxy.net.conn import Conn

import harness

BURST = 8
# a full collection after the burst walks fewer objects than this (the pytest session alone
# holds hundreds of thousands: every module, fixture and test function)
WALKED_AFTER_BURST = 30_000
ONE_CYCLE = 5_000  # objects one prepare/release cycle may leave frozen, generously


@pytest.fixture
def state_dir(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> str:
    path = os.path.join(str(tmp_path), "netcut-state")
    monkeypatch.setenv("NETCUT_STATE_DIR", path)
    return path


async def settled(proxy: EgressProxy, before: int) -> None:
    """Wait until the proxy has settled its heap since `before` (a deadline, not a sleep)."""
    deadline = time.monotonic() + 30
    while proxy.heap.settled <= before:
        assert time.monotonic() < deadline, "the heap was never settled after the burst"
        await asyncio.sleep(0.01)


@pytest.mark.userns
async def test_a_burst_leaves_a_small_heap_for_full_collections(state_dir: str) -> None:
    threshold = gc.get_threshold()
    proxy = EgressProxy(build_settings({}), listen=["127.0.0.1:0"])
    hosts = [harness.create_test_host() for _ in range(BURST)]
    await proxy.start()
    try:
        assert gc.get_threshold() == (heap.YOUNG, *heap.OLDER)
        assert gc.get_freeze_count() > WALKED_AFTER_BURST, "start-up froze the heap"
        frozen = gc.get_freeze_count()
        before = proxy.heap.settled
        executions = await asyncio.gather(
            *(prepare_execution(h.ns, Policy(allow=["example.test"]), proxy) for h in hosts)
        )
        await settled(proxy, before)
        walked = len(gc.get_objects())
        assert walked < WALKED_AFTER_BURST, f"a full collection walks {walked} objects"
        assert gc.get_freeze_count() > frozen, "the burst's sandboxes were frozen"
        assert proxy.heap.longest_ms > 0, "the settle's own pause is measured"
        await asyncio.gather(*(release_execution(proxy, ex, restore=True) for ex in executions))
    finally:
        await proxy.stop()
        for h in hosts:
            h.remove()
    assert gc.get_threshold() == threshold, "stop restored the thresholds"


@pytest.mark.userns
async def test_churn_keeps_the_frozen_set_bounded(state_dir: str) -> None:
    """Frozen cycles that became garbage (released sandboxes) are compacted away."""
    proxy = EgressProxy(build_settings({}), listen=["127.0.0.1:0"])
    await proxy.start()
    try:
        base = proxy.heap.base
        for _ in range(12):
            host = harness.create_test_host()
            try:
                before = proxy.heap.settled
                ex = await prepare_execution(host.ns, Policy(), proxy)
                await release_execution(proxy, ex, restore=False, forget=True)
                await settled(proxy, before)
            finally:
                host.remove()
            # a settle compacts once the frozen set passed GROWTH times the last
            # compaction's, so it never exceeds that by more than one cycle's survivors
            limit = heap.GROWTH * max(base, proxy.heap.base) + ONE_CYCLE
            assert gc.get_freeze_count() <= limit
    finally:
        await proxy.stop()


async def test_a_removed_listener_leaves_no_cycle_behind() -> None:
    """A removed listener (a released sandbox's) is freed by reference counting: before, the
    listener and its acceptor (whose callbacks name the listener) were a cycle, about a
    dozen objects per released sandbox that stayed frozen until a compaction, so churn alone
    grew the frozen set and brought on compactions (docs/proxy.md#garbage-collection)."""
    proxy = EgressProxy(build_settings({}), listen=["127.0.0.1:0"])
    await proxy.start()
    try:
        added = await proxy.add_listener("127.0.0.1:0")
        listener = weakref.ref(added)
        del added
        proxy.heap.settle()  # frozen now, as a sandbox's listener is after its prepare burst
        assert proxy.heap.compactions == 0
        gc.disable()  # only reference counting may free it
        try:
            removed = listener()
            assert removed is not None
            assert proxy.remove_listener(removed)
            del removed
            assert listener() is None, "the removed listener is only freed by a collection"
        finally:
            gc.enable()
    finally:
        await proxy.stop()


async def test_a_closed_connection_leaves_no_cycle_behind() -> None:
    """A client connection that ended is freed by reference counting: before, its `Conn`
    and its socket's side named each other, and every closed connection (each prepare's
    probes, every agent's) left a dozen objects for the collector, frozen with the rest if
    a settle came first (docs/proxy.md#garbage-collection)."""
    loop = asyncio.get_running_loop()
    async with EgressProxy(build_settings({}), listen=["127.0.0.1:0"], tune_gc=False) as proxy:
        host, port = proxy.addresses[0]
        for head in (b"", b"GET http://x.test/ HTTP/1.1\r\nHost: x.test\r\n\r\n"):
            sock = socket.socket()
            sock.setblocking(False)
            await loop.sock_connect(sock, (host, port))
            if head:
                await loop.sock_sendall(sock, head)
                assert (await loop.sock_recv(sock, 100)).startswith(b"HTTP/1.1 ")
            sock.close()
        deadline = time.monotonic() + 10
        while proxy.metrics()["open_connections"]:
            assert time.monotonic() < deadline, "the proxy never saw the connections end"
            await asyncio.sleep(0.01)
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            gc.collect()
            left = [type(o).__name__ for o in gc.garbage if isinstance(o, Conn | ClientSide)]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
        assert left == [], f"closed connections left cycles: {left}"


# A compaction unfreezes and collects the whole process: in the test session that is also
# every cycle an earlier test left frozen (each proxy's start-up freezes the heap), whose
# finalizers then run in this test (an unclosed socket's ResourceWarning from a neighbour
# failed it in a loaded CI run). So it runs in an interpreter of its own, warnings as errors.
COMPACTION = """
import gc, weakref
from egress.proxy import heap

class Node:
    other = None

a, b = Node(), Node()
a.other, b.other = b, a
gone = weakref.ref(a)
gc.freeze()
del a, b
gc.collect()
assert gone() is not None, "a frozen cycle is not collected"
heap.Heap().compact()
assert gone() is None, "the compaction did not free the cycle that died frozen"
print("freed")
"""


def test_a_compaction_frees_cycles_that_died_frozen() -> None:
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", COMPACTION],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert (result.returncode, result.stdout) == (0, "freed\n"), result.stderr


def test_a_settle_counts_the_garbage_it_collected() -> None:
    """What the settles found unreachable is counted (bench.scale reports it): the cycles
    the bursts made, which a settle collects before it freezes the rest."""

    class Node:
        other: object = None

    settler = heap.Heap()
    # no compaction is due (a compaction would collect what other tests left frozen, and
    # run their finalizers here), and no automatic collection finds the cycle first
    settler.base = max(1, gc.get_freeze_count())
    gc.disable()
    try:
        a, b = Node(), Node()
        a.other, b.other = b, a
        gone = weakref.ref(a)
        del a, b
        settler.settle()
    finally:
        gc.enable()
    assert gone() is None
    assert settler.garbage >= 2
    assert settler.compactions == 0


def test_a_settle_collects_the_youngest_generation_only() -> None:
    """A settle's pause is a young collection, not a full one: after 400 prepares a full
    collection of what the burst made took 11-24 ms of CPU and found nothing
    (docs/proxy.md#garbage-collection)."""
    settler = heap.Heap()
    settler.base = max(1, gc.get_freeze_count())  # no compaction is due
    started: list[int] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started.append(info["generation"])

    gc.callbacks.append(seen)
    try:
        settler.settle()
    finally:
        gc.callbacks.remove(seen)
    assert started == [0]
    assert settler.compactions == 0


async def test_tune_gc_false_leaves_the_collector_alone() -> None:
    threshold, frozen = gc.get_threshold(), gc.get_freeze_count()
    async with EgressProxy(build_settings({}), listen=["127.0.0.1:0"], tune_gc=False) as proxy:
        assert gc.get_threshold() == threshold
        assert gc.get_freeze_count() == frozen
        assert proxy.heap.settled == 0

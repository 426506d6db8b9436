"""The threads that open sockets inside sandboxes' namespaces (egress/proxy/net/netns.py)
go back to the proxy's own namespace after every job, so the next job (or anything else the
thread does) never starts from a sandbox; they are reused rather than started per socket;
and a job that fails, whether naming, entering or inside the namespace, reaches its caller
and leaves the pool serving."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from egress.proxy.net import netns
from egress.proxy.net.netns import NamespaceError, call_in_netns, call_in_netns_thread

import harness

pytestmark = pytest.mark.userns


def _own_netns() -> str:
    return os.readlink("/proc/thread-self/ns/net")


def _pool_threads() -> list[int]:
    return [t.native_id for t in threading.enumerate() if t.name == "netns" and t.native_id]


def _netns_of(tid: int) -> str:
    return os.readlink(f"/proc/self/task/{tid}/ns/net")


def test_pool_threads_go_home_after_each_job_and_are_reused() -> None:
    home = _own_netns()
    with harness.test_host() as a, harness.test_host() as b:
        seen_a = call_in_netns_thread(a.ns, _own_netns)
        seen_b = call_in_netns_thread(b.ns, _own_netns)
        assert home not in (seen_a, seen_b)
        assert seen_a == f"net:[{os.stat(a.path).st_ino}]"
        assert seen_b == f"net:[{os.stat(b.path).st_ino}]"
        threads = _pool_threads()
        assert threads, "the pool's threads live on between jobs"
        assert len(threads) <= netns.POOL_SIZE
        # each went back: every pool thread is in this process's namespace again
        assert {_netns_of(t) for t in threads} == {home}
        for _ in range(20):  # reused: twenty more jobs start no thread beyond the pool's size
            assert call_in_netns_thread(a.ns, _own_netns) == seen_a
        assert len(_pool_threads()) <= netns.POOL_SIZE
        assert {_netns_of(t) for t in _pool_threads()} == {home}


def test_failing_jobs_reach_the_caller_and_leave_the_pool_serving() -> None:
    home = _own_netns()

    def boom() -> None:
        raise ValueError("inside")

    with harness.test_host() as a:
        with pytest.raises(ValueError, match="inside"):
            call_in_netns_thread(a.ns, boom)
        with pytest.raises(NamespaceError):
            call_in_netns_thread("egt-no-such-namespace-0", _own_netns)
        assert call_in_netns_thread(a.ns, _own_netns) != home
        assert {_netns_of(t) for t in _pool_threads()} == {home}


def test_concurrent_jobs_from_the_loop_each_land_in_their_namespace() -> None:
    async def main(names: list[str]) -> list[str]:
        return await asyncio.gather(*(call_in_netns(n, _own_netns) for n in names * 10))

    hosts = [harness.create_test_host() for _ in range(3)]
    try:
        names = [h.ns for h in hosts]
        want = [call_in_netns_thread(n, _own_netns) for n in names]
        assert len(set(want)) == 3
        assert asyncio.run(main(names)) == want * 10
        assert {_netns_of(t) for t in _pool_threads()} == {_own_netns()}
    finally:
        for h in hosts:
            h.remove()


def test_a_job_submitted_as_the_last_is_reported_finds_that_thread_free() -> None:
    """A caller that submits its next job the moment it hears of the last (a churn of
    sandboxes: prepare, release, prepare) starts no other thread: each holds a descriptor,
    its home namespace, and test_sandbox_churn counted one started so as a leak. A pool of
    the test's own, so that threads other tests left waiting cannot stand in."""
    pool = netns._Threads()
    seen: list[object] = []
    finished = threading.Event()

    with harness.test_host() as a:

        def done(result: object, error: BaseException | None) -> None:
            seen.append(result if error is None else error)
            if len(seen) < 5:
                pool.submit((a.ns, _own_netns, done))  # before this report has returned
            else:
                finished.set()

        pool.submit((a.ns, _own_netns, done))
        assert finished.wait(60)
        assert seen == [f"net:[{os.stat(a.path).st_ino}]"] * 5
        assert pool.count == 1, f"{pool.count} threads for jobs one after another"

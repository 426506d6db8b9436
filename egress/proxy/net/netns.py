"""Open a socket inside another network namespace without moving the caller.

Strategy (docs/proxy.md#listening-inside-a-namespace-framework-route-forwarders): a thread
of a small pool enters the target namespace with `setns(2)` — which changes the namespace
of that one thread only — creates and binds the socket there (`listener.listen_socket`),
goes back to the namespace it started in, and hands the socket over. A socket keeps the
namespace it was created in, so the host process's event loop can then serve it while every
other thread stays where it was. No code of ours runs in the sandbox's namespace longer than
a `bind()`; a thread that cannot go back exits instead of taking another job. The threads
live on between jobs (a thread started per socket cost a prepare ~25 us of CPU and held
the loop in `Thread.start`: docs/benchmarks.md#hundreds-of-sandboxes-prepare-release-churn)
and end after `IDLE_S` without work.

Python 3.11 has no `os.setns`, so libc's is called through ctypes. Needs CAP_SYS_ADMIN.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
import logging
import os
import queue
import socket
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, TypeAlias, TypeVar

from ...errors import EgressError
from ...validate import as_count, as_port
from .listener import BACKLOG, listen_socket

if TYPE_CHECKING:
    from netcut.targetref import TargetRef

CLONE_NEWNET = 0x40000000
log = logging.getLogger("egress")
T = TypeVar("T")
NamespaceLike: TypeAlias = "str | int | TargetRef"


class NamespaceError(EgressError):
    """The namespace cannot be entered (missing, or no privilege)."""


# What a process without CAP_SYS_ADMIN is told when it cannot open or enter a namespace.
_PRIVILEGE_HINT = (
    " (opening a socket inside another process's network namespace needs root or"
    " CAP_SYS_ADMIN; without them a container's listeners come from netcut's helper:"
    ' cut_mode="helper", docs/netcut.md#modes-and-privileges)'
)


@functools.cache
def _libc() -> ctypes.CDLL:
    """Loaded once: `find_library` runs `ldconfig -p` in a subprocess, which cost every
    listener opened in a namespace ~0.7 ms of this process's CPU and ~3 ms of wall time
    (two per prepared sandbox: docs/benchmarks.md#hundreds-of-sandboxes)."""
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def namespace_path(ns: NamespaceLike) -> str:
    """The namespace file of `ns`, read by netcut's target parser so that both packages
    agree on every form (docs/netcut.md#targets): a name, a path, a PID (int, "pid:N" or a
    digit string), or a container ("docker:ID", ... : its task's PID, from its runtime).

    Raises NamespaceError for a value that names nothing or a target that does not exist."""
    # Imported here: `import egress` does not load netcut until a namespace is named.
    from netcut.errors import NetcutError
    from netcut.resolve import resolve_target

    try:
        return resolve_target(ns).path
    except NetcutError as exc:
        raise NamespaceError(f"network namespace {ns!r}: {exc}") from None


# At most this many threads enter namespaces at once (a name is resolved in the thread: a
# container's runtime may take a while to answer); an idle one ends after IDLE_S.
POOL_SIZE = 4
IDLE_S = 30.0
# the pool's threads are named so: each holds its home namespace open while it lives, which a
# count of the process's descriptors must tell from a leak (bench/scale.py)
THREAD_NAME: Final = "netns"

Job: TypeAlias = (
    "tuple[NamespaceLike, Callable[[], Any], Callable[[Any, BaseException | None], None]]"
)


class _Threads:
    """The pool: jobs in a queue, a thread started when none waits for one."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[Job] = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.count = 0
        self.waiting = 0

    def submit(self, job: Job) -> None:
        with self.lock:  # put under the lock: a thread ending idle sees it or is counted
            self.jobs.put(job)
            start = self.waiting == 0 and self.count < POOL_SIZE
            if start:
                self.count += 1
        if start:
            try:
                threading.Thread(target=self._serve, name=THREAD_NAME, daemon=True).start()
            except BaseException:
                with self.lock:
                    self.count -= 1
                raise

    def _serve(self) -> None:
        try:
            home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            home = -1
        try:
            free = False  # counted in `waiting` already (before its last job was reported)
            while True:
                if not free:
                    with self.lock:
                        self.waiting += 1
                try:
                    job = self.jobs.get(timeout=IDLE_S)
                except queue.Empty:
                    with self.lock:
                        if not self.jobs.empty():
                            free = True
                            continue  # a job came in as the wait ended
                        self.waiting -= 1
                        self.count -= 1
                    return
                with self.lock:
                    self.waiting -= 1
                free = self._run(job, home)
                if not free:
                    return  # could not go home: this thread takes no other job
        finally:
            if home >= 0:
                os.close(home)

    def _run(self, job: Job, home: int) -> bool:
        """Run `job`; True when this thread is home again, counted as waiting before the
        job is reported: a caller that submits its next job as soon as it hears (one
        sandbox's listeners, a churn of sandboxes) finds this thread free instead of
        starting another, which would hold one more descriptor (its home namespace) until
        it idles out (docs/proxy.md#listening-inside-a-namespace-framework-route-forwarders)."""
        try:
            went_home, report = _run_job(job, home)
        except BaseException:
            went_home, report = False, None
        with self.lock:
            if went_home:
                self.waiting += 1
            else:
                self.count -= 1
        if report is not None:
            try:
                report()
            except Exception:  # a bug in a caller's `done`: this thread is fine, and counted
                log.exception("egress: a namespace job's report failed")
        return went_home


def _run_job(job: Job, home: int) -> tuple[bool, Callable[[], None]]:
    """Name and enter the job's namespace, run its function and go back to `home`; returns
    whether the thread is home (False: it must take no other job) and the job's report
    (its `done` with the outcome), for the pool to make once it has counted the thread."""
    ns, fn, done = job
    try:
        path = namespace_path(ns)
    except BaseException as exc:  # NamespaceError, or whatever naming it raised
        return True, functools.partial(done, None, exc)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        hint = _PRIVILEGE_HINT if isinstance(exc, PermissionError) else ""
        refused = NamespaceError(f"cannot open network namespace {path!r}: {exc}{hint}")
        return True, functools.partial(done, None, refused)
    try:  # closed once entered, before anything is reported: a caller that counts its
        # descriptors after the job (bench/scale.py's churn) never sees it still open
        why = None if _libc().setns(fd, CLONE_NEWNET) == 0 else os.strerror(ctypes.get_errno())
    finally:
        os.close(fd)
    if why is not None:
        refused = NamespaceError(f"cannot enter network namespace {path!r}: {why}{_PRIVILEGE_HINT}")
        return True, functools.partial(done, None, refused)
    error: BaseException | None = None
    try:
        result = fn()
    except BaseException as exc:  # handed back to the caller
        result, error = None, exc
    went_home = home >= 0 and _libc().setns(home, CLONE_NEWNET) == 0
    return went_home, functools.partial(done, result, error)


_threads = _Threads()


def _forget_threads_in_child() -> None:
    """A forked child has none of the parent's threads: it starts its own."""
    global _threads
    _threads = _Threads()


os.register_at_fork(after_in_child=_forget_threads_in_child)


def _start_in_netns_thread(
    ns: NamespaceLike, fn: Callable[[], T], done: Callable[[T | None, BaseException | None], None]
) -> None:
    """Have a thread of the pool name and enter namespace `ns`, run `fn` and report through
    `done(result, error)`, then go back to its own namespace."""
    _threads.submit((ns, fn, done))


def call_in_netns_thread(ns: NamespaceLike, fn: Callable[[], T]) -> T:
    """Run `fn` in a fresh thread that has entered namespace `ns`; return its result.

    Raises `NamespaceError` if the namespace cannot be opened or entered; re-raises whatever
    `fn` raised. Blocks the calling thread: from a coroutine, await `call_in_netns` instead.
    """
    finished = threading.Event()
    outcome: list[tuple[T | None, BaseException | None]] = []

    def done(result: T | None, error: BaseException | None) -> None:
        outcome.append((result, error))
        finished.set()

    _start_in_netns_thread(ns, fn, done)
    finished.wait()
    result, error = outcome[0]
    if error is not None:
        raise error
    return result  # type: ignore[return-value]


async def call_in_netns(ns: NamespaceLike, fn: Callable[[], T]) -> T:
    """`call_in_netns_thread` without blocking the event loop: the thread hands its result
    to the loop (issue: under 200 concurrent prepares a joined thread held the loop ~10 ms)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def done(result: T | None, error: BaseException | None) -> None:
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the loop closed meanwhile
            if isinstance(result, socket.socket):
                result.close()

    _start_in_netns_thread(ns, fn, done)
    return await future


def listen_in_netns(
    ns: NamespaceLike, host: str, port: int, *, backlog: int = BACKLOG
) -> socket.socket:
    """A listening TCP socket bound to `host:port` inside namespace `ns` (non-blocking)."""
    _check_listen(port, backlog, "listen_in_netns")
    return call_in_netns_thread(ns, lambda: listen_socket(host, port, backlog))


async def listen_in_netns_async(
    ns: NamespaceLike, host: str, port: int, *, backlog: int = BACKLOG
) -> socket.socket:
    """`listen_in_netns` off the event loop."""
    _check_listen(port, backlog, "listen_in_netns_async")
    return await call_in_netns(ns, lambda: listen_socket(host, port, backlog))


def _check_listen(port: object, backlog: object, what: str) -> None:
    """Typed before the namespace is entered (docs/policy.md#types)."""
    as_port(port, f"{what} port")
    as_count(backlog, f"{what} backlog")

"""The public operations: cut, restore, status, probe (and their async wrappers).

Each resolves the target, opens the namespace file once (the fd names the namespace for the
whole operation, so a name re-pointed meanwhile cannot redirect it), applies the safety rails,
then runs the whole operation as one job inside the namespace in one of netcut's worker
processes (direct/worker.py, direct/executor.py's jobs, named so that the caller never loads
python-iptables): a cut with its probe (and, for egress, its status) is one round trip. The
caller's own namespace, netfilter tables and event loop are never touched.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import threading
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, TypeVar

import netcut.direct.probe as probe_mod
from netcut import flow, safety
from netcut.argtypes import check_flags, check_list, check_seconds
from netcut.collect import Collected, collect
from netcut.direct.probe import ProbeResult
from netcut.direct.worker import DEFAULT_TIMEOUT_S, job, ns_identity, pool_size, run_in_netns
from netcut.errors import InvalidInput, PrivilegeError, TargetNotFound
from netcut.flow import CutResult, RestoreResult
from netcut.plan.model import Keep, NamespaceState, parse_keep
from netcut.plan.status import CutStatus
from netcut.plan.transparent import Redirect
from netcut.records import Store, state_dir
from netcut.resolve import ResolvedTarget, TargetRef, parse_nameservers, resolve_target

TargetLike = TargetRef | ResolvedTarget | str | int
T = TypeVar("T")
KeepLike = str | Keep

__all__ = [
    "CutResult",
    "DirectExecutor",
    "RestoreResult",
    "cut",
    "cut_and_status",
    "forget",
    "gc",
    "probe",
    "restore",
    "status",
]


class DirectExecutor:
    """Reads a namespace's state through netcut's worker (tests compare it with helper
    mode's); the operations themselves run whole in the worker (executor.InNamespace)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def read_state(
        self, keeps: tuple[Keep, ...], nameservers: tuple[str, ...], verify: bool = False
    ) -> NamespaceState:
        state: NamespaceState = run_in_netns(
            self.fd, job("job_read_state"), keeps, nameservers, verify
        )
        return state

    def read_marks(self) -> NamespaceState:
        """What a restore reads: `read_state(...).marks()`, read alone."""
        marks: NamespaceState = run_in_netns(self.fd, job("job_read_marks"))
        return marks


def parse_keeps(keep: Iterable[KeepLike], field: str = "keep") -> tuple[Keep, ...]:
    check_list(keep, field)
    return tuple(dict.fromkeys(parse_keep(k) for k in keep))


def probe_targets(items: Iterable[KeepLike], field: str) -> tuple[Keep, ...]:
    """ADDR:PORTs to probe; one without a port is refused before anything is applied (a probe
    connects, so `cut --expect-blocked 1.2.3.4` must not be accepted and silently skipped)."""
    found = parse_keeps(items, field)
    for keep in found:
        if keep.port is None:
            raise InvalidInput(f"{field} {keep}: give ADDR:PORT (a probe needs a port)")
    return found


def _open(target: TargetLike) -> tuple[ResolvedTarget, int, tuple[int, int]]:
    resolved = resolve_target(target)
    try:
        fd = os.open(resolved.path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise TargetNotFound(f"{resolved}: vanished") from None
    except PermissionError:
        raise PrivilegeError(f"{resolved}: permission denied opening the namespace") from None
    return resolved, fd, ns_identity(fd)


def _nameservers(resolved: ResolvedTarget) -> tuple[str, ...]:
    if not resolved.resolv_conf:
        return ()
    try:
        with open(resolved.resolv_conf) as f:
            return parse_nameservers(f.read())
    except OSError:
        return ()


def cut(
    target: TargetLike,
    keep: Iterable[KeepLike] = (),
    *,
    probe: bool = True,
    expect_blocked: Iterable[KeepLike] = (),
    force: bool = False,
    allow_privileged: bool = False,
    dry_run: bool = False,
    probe_timeout: float = probe_mod.DEFAULT_TIMEOUT_S,
    redirect: Redirect | None = None,
) -> CutResult:
    """Cut `target` down to loopback and `keep` (ADDR[:PORT]), then probe it.

    With `redirect` (transparent mode, docs/netcut.md#transparent-mode), every other TCP
    connection is redirected to `redirect.port` and every DNS query to `redirect.dns_port` on
    the namespace's loopback, where the proxy listens; `expect_blocked` cannot be probed then
    (every TCP destination reaches the proxy, which judges it) and is refused.

    Why: right before an agent runs, the namespace must lose every way out but the proxy. The
    cut is idempotent: a namespace already cut with the same keeps is left alone (changed is
    False). The probe (kept ADDR:PORTs connect, `expect_blocked` ones do not) fails closed:
    the cut stays in place and ProbeFailed is raised.

    Raises InvalidInput (bad keep, or already cut with other keeps), TargetNotFound,
    UnsafeTarget (own/host namespace unless `force`; a process holding NET_ADMIN, NET_RAW or
    SYS_ADMIN in it unless `allow_privileged`; netcut's marks without a record), PrivilegeError,
    StateError (the record directory cannot be written: nothing changed), ApplyFailed (rolled
    back, or `rolled_back` False when the worker died: `restore` undoes what ran), ProbeFailed.
    """
    result: CutResult = _cut_job(
        job("job_cut"),
        target,
        keep,
        probe=probe,
        expect_reachable=(),
        expect_blocked=expect_blocked,
        force=force,
        allow_privileged=allow_privileged,
        dry_run=dry_run,
        probe_timeout=probe_timeout,
        redirect=redirect,
    )
    return result


def cut_and_status(
    target: TargetLike,
    keep: Iterable[KeepLike] = (),
    *,
    expect_reachable: Iterable[KeepLike] = (),
    expect_blocked: Iterable[KeepLike] = (),
    force: bool = False,
    allow_privileged: bool = False,
    probe_timeout: float = probe_mod.DEFAULT_TIMEOUT_S,
    redirect: Redirect | None = None,
) -> tuple[CutResult, CutStatus]:
    """`cut` with its probe (of the keeps with a port and `expect_reachable`), then `status`
    read afresh from the namespace, in one round trip to the worker: what egress's
    prepare_execution proves (helper mode's twin is netcut.helper.cut_and_status). Raises
    as `cut` does."""
    found: tuple[CutResult, CutStatus] = _cut_job(
        job("job_cut_and_status"),
        target,
        keep,
        probe=True,
        expect_reachable=expect_reachable,
        expect_blocked=expect_blocked,
        force=force,
        allow_privileged=allow_privileged,
        dry_run=False,
        probe_timeout=probe_timeout,
        redirect=redirect,
    )
    return found


def _cut_job(
    job: Any,
    target: TargetLike,
    keep: Iterable[KeepLike],
    *,
    probe: bool,
    expect_reachable: Iterable[KeepLike],
    expect_blocked: Iterable[KeepLike],
    force: bool,
    allow_privileged: bool,
    dry_run: bool,
    probe_timeout: float,
    redirect: Redirect | None,
) -> Any:
    check_flags(probe=probe, force=force, allow_privileged=allow_privileged, dry_run=dry_run)
    check_seconds(probe_timeout, "probe_timeout")
    keeps = parse_keeps(keep)
    reachable = probe_targets(expect_reachable, "expect_reachable")
    blocked = probe_targets(expect_blocked, "expect_blocked")
    if redirect is not None and blocked:
        raise InvalidInput(
            "--expect-blocked cannot be probed in transparent mode: every TCP "
            "connection is redirected to the proxy, which judges it"
        )
    safety.require_privilege()
    ticket = _walk_ticket()
    resolved, fd, identity = _open(target)
    try:
        if not force:
            safety.refuse_unsafe_namespace(identity)
        request = flow.CutRequest(
            keeps,
            _nameservers(resolved),
            dry_run,
            {"target": str(resolved)},
            probe,
            blocked,
            probe_timeout,
            redirect,
            reachable,
        )
        store = Store.for_namespace(identity)
        timeout = DEFAULT_TIMEOUT_S + (probe_timeout if probe else 0.0)
        # The privilege rail runs once a worker is free, right before the job: any walk of
        # /proc another cut began since this one was asked serves it (safety.py), and a
        # dry run is checked too (it shows what the cut would do).
        rail = None if allow_privileged else (lambda: safety.refuse_privileged(identity, ticket))
        found = run_in_netns(fd, job, store, str(resolved), request, timeout=timeout, before=rail)
        if isinstance(found, tuple):
            return (replace(found[0], identity=identity), found[1])
        return replace(found, identity=identity)
    finally:
        os.close(fd)


def restore(target: TargetLike) -> RestoreResult:
    """Undo a cut: put back exactly what it removed, remove exactly what it added.

    Restoring a namespace that is not cut changes nothing (changed is False). Raises
    TargetNotFound, PrivilegeError, StateError (the record directory cannot be written:
    nothing changed), ApplyFailed (restore incomplete; run it again).
    """
    safety.require_privilege()
    resolved, fd, identity = _open(target)
    try:
        result: RestoreResult = run_in_netns(
            fd, job("job_restore"), Store.for_namespace(identity), str(resolved)
        )
        return result
    finally:
        os.close(fd)


def status(target: TargetLike) -> CutStatus:
    """Whether `target` is cut (every effect of the recorded cut holds), partially cut, or
    not cut. Raises TargetNotFound, PrivilegeError."""
    safety.require_privilege()
    resolved, fd, identity = _open(target)
    try:
        store = Store.for_namespace(identity)
        found: CutStatus = run_in_netns(fd, job("job_status"), store, _nameservers(resolved))
        return found
    finally:
        os.close(fd)


def forget(target: TargetLike | tuple[int, int]) -> bool:
    """Remove the record of a namespace that will be destroyed, without restoring it (a
    later restore could then no longer put its routes back). `target` may be the namespace's
    identity (st_dev, st_ino), as `CutResult.identity` holds it, which works after the
    namespace is gone. Returns whether a record was removed. Raises StateError."""
    if isinstance(target, tuple):
        store = Store.for_namespace(target)
    else:
        _, fd, identity = _open(target)
        os.close(fd)
        store = Store.for_namespace(identity)
    with store.locked():
        existed = os.path.exists(store.path)
        store.remove()
    return existed


def gc() -> Collected:
    """Remove the records of namespaces that no longer exist (`netcut gc`). Raises
    StateError."""
    return collect(state_dir())


def probe(
    target: TargetLike,
    expect_reachable: Iterable[KeepLike] = (),
    expect_blocked: Iterable[KeepLike] = (),
    *,
    timeout: float = probe_mod.DEFAULT_TIMEOUT_S,
) -> ProbeResult:
    """Connect from inside `target` to each ADDR:PORT; report which behaved as expected.

    Never raises for a failed expectation (check `result.ok`); raises InvalidInput for a
    target without a port, TargetNotFound, PrivilegeError.
    """
    check_seconds(timeout, "timeout")
    reachable = probe_targets(expect_reachable, "expect_reachable")
    blocked = probe_targets(expect_blocked, "expect_blocked")
    safety.require_privilege()
    _, fd, _ = _open(target)
    try:
        result: ProbeResult = run_in_netns(
            fd, probe_mod.run_probe, reachable, blocked, timeout, timeout=timeout + 10
        )
        return result
    finally:
        os.close(fd)


# The privilege rail's ticket (safety.walk_ticket) of a cut asked through the async API, for
# the thread that runs it.
_asked = threading.local()


def _walk_ticket() -> int:
    """The ticket of the cut this thread runs: taken when the async API was called (the cut
    was asked then), else now."""
    ticket: int | None = getattr(_asked, "ticket", None)
    return safety.walk_ticket() if ticket is None else ticket


class _Threads:
    """The threads the async API runs the synchronous one in: as many as netcut has workers
    (`pool_size`), since each call spends its time waiting for one. With the loop's default
    executor (CPU count + 4 threads), 200 concurrent prepares kept the threads beyond the
    workers' number waking on the worker pool's condition: 53-68 us of the caller's CPU per
    call waiting for a worker, 8-12 us here, where calls wait in the executor's queue instead
    (docs/netcut.md#many-sandboxes-at-once). Made at first use, again in a forked child."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.executor: ThreadPoolExecutor | None = None

    def run(self, func: Callable[[], T]) -> Awaitable[T]:
        with self.lock:
            if self.executor is None:
                self.executor = ThreadPoolExecutor(pool_size(), thread_name_prefix="netcut")
            executor = self.executor
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()
        return loop.run_in_executor(executor, functools.partial(context.run, func))


_threads = _Threads()


def _fresh_threads_in_child() -> None:
    global _threads
    _threads = _Threads()


os.register_at_fork(after_in_child=_fresh_threads_in_child)


def _in_thread(func: Callable[..., T], *args: Any, **kwargs: Any) -> Awaitable[T]:
    """`func(*args, **kwargs)` in one of the async API's threads."""
    return _threads.run(functools.partial(func, *args, **kwargs))


def _cut_in_thread(func: Callable[..., T], *args: Any, **kwargs: Any) -> Awaitable[T]:
    """`func` in a worker thread, with its walk ticket taken now: the cut is asked when the
    coroutine is called, not when a thread of the loop's executor (a handful) is free, so
    that one walk of /proc begun after a burst of asks serves the whole burst
    (docs/netcut.md#safety-rails)."""
    ticket = safety.walk_ticket()

    def run() -> T:
        _asked.ticket = ticket
        try:
            return func(*args, **kwargs)
        finally:
            _asked.ticket = None

    return _in_thread(run)


async def cut_async(target: TargetLike, keep: Iterable[KeepLike] = (), **kwargs: Any) -> CutResult:
    """`cut` in a worker thread, so the caller's event loop keeps running."""
    check_list(keep, "keep")
    return await _cut_in_thread(cut, target, list(keep), **kwargs)


async def cut_and_status_async(
    target: TargetLike, keep: Iterable[KeepLike] = (), **kwargs: Any
) -> tuple[CutResult, CutStatus]:
    """`cut_and_status` in a worker thread."""
    check_list(keep, "keep")
    return await _cut_in_thread(cut_and_status, target, list(keep), **kwargs)


async def restore_async(target: TargetLike) -> RestoreResult:
    return await _in_thread(restore, target)


async def status_async(target: TargetLike) -> CutStatus:
    return await _in_thread(status, target)


async def probe_async(
    target: TargetLike,
    expect_reachable: Iterable[KeepLike] = (),
    expect_blocked: Iterable[KeepLike] = (),
    **kwargs: Any,
) -> ProbeResult:
    check_list(expect_reachable, "expect_reachable")
    check_list(expect_blocked, "expect_blocked")
    return await _in_thread(probe, target, list(expect_reachable), list(expect_blocked), **kwargs)

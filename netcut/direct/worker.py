"""Run a function inside a network namespace, in netcut's worker process, and return its result.

Why another process: setns(2) changes the calling thread only, python-iptables keeps its Table
and Chain objects (and libiptc its handles) process-wide, and pyroute2's synchronous API runs
an event loop of its own. A worker process that enters the namespace, does the work and answers
through a socket leaves the caller's namespace, netfilter state and event loop untouched.

Why long-lived workers, started as fresh interpreters: a fork per call costs ~4 ms for an
interpreter that has loaded pyroute2 and python-iptables, plus copy-on-write faults on every
page the child touches (a cut took ~30 ms that way, ~5 ms in a warm worker). A *forked* worker
would also inherit the caller's file descriptors (an embedding proxy's client sockets would not
close while the worker held copies), locks held by other threads, and garbage whose finalizers
could close the wrong fd. So a worker is a new `python` (exec, close_fds) started on first use
or by `start_worker()`. Each serves one job at a time; a small pool of them ($NETCUT_WORKERS,
default the CPU count, 2 to 4) serves jobs for different namespaces at once, and a job takes
the record's own lock (records.py), so only jobs for the same namespace wait for each other
(docs/netcut.md#latency). A worker enters the job's namespace by the fd passed with SCM_RIGHTS,
drops python-iptables' cached tables before each job, and goes back to its own namespace after
it. A job that overruns `timeout` gets its worker killed (a fresh one replaces it), so a wedged
kernel call cannot hang the caller. A worker that dies or is killed mid-job is never taken for
a rollback: the caller gets ApplyFailed with `rolled_back` False and the record stays, so
`restore` can undo exactly what ran (docs/netcut.md#the-journal). A worker exits when the
caller's end of its socket closes (the caller exited).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from netcut.errors import ApplyFailed, NetcutError, PrivilegeError

CLONE_NEWNET = 0x40000000
# A cut is a few dozen netlink and netfilter calls (~10 ms); 20 s means something is wedged.
DEFAULT_TIMEOUT_S = 20.0
# Starting the worker is an interpreter start plus pyroute2 and python-iptables imports:
# ~0.5 s, a few seconds on a loaded machine.
READY_TIMEOUT_S = 30.0
_LEN = struct.Struct("!I")

T = TypeVar("T")
_libc = ctypes.CDLL(None, use_errno=True)


def ns_identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino)


def setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise PrivilegeError(f"setns into the target namespace failed: {os.strerror(err)}")


class _Worker:
    def __init__(self) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        code = f"from netcut.direct.worker import serve; serve({child.fileno()})"
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", code],
                pass_fds=[child.fileno()],
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # a Ctrl-C meant for the caller does not hit a job
            )
        finally:
            child.close()
        self.sock = parent
        self.ready = False
        self.jobs = 0

    def wait_ready(self) -> None:
        """The worker says `R` once it has imported what jobs need."""
        if not self.ready:
            if _recv_exact(self.sock, 1, time.monotonic() + READY_TIMEOUT_S) != b"R":
                raise EOFError("namespace worker sent garbage instead of ready")
            self.ready = True

    def call(
        self, fd: int, func: Callable[..., Any] | str, args: tuple[Any, ...], timeout: float
    ) -> Any:
        self.wait_ready()
        payload = pickle.dumps((func, args))
        socket.send_fds(self.sock, [_LEN.pack(len(payload))], [fd])
        self.sock.sendall(payload)
        return _recv_msg(self.sock, time.monotonic() + timeout)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def dead(self) -> bool:
        return self.proc.poll() is not None

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.sock.close()


POOL_ENV = "NETCUT_WORKERS"
# libxtables leaks ~1 KB for each backstop a status decodes (python-iptables' rule decoding,
# docs/netcut.md#latency): a worker retires after this many jobs, so a long-lived caller's
# workers stay within a few MB of where they started.
RECYCLE_AFTER_JOBS = 4000


def pool_size() -> int:
    """How many workers may run at once: $NETCUT_WORKERS, else the CPU count within 2..4
    (each is ~50 MB of RSS; more than the CPUs would only queue in the kernel instead)."""
    try:
        wanted = int(os.environ.get(POOL_ENV, "0"))
    except ValueError:
        wanted = 0
    return wanted if wanted > 0 else min(4, max(2, os.cpu_count() or 1))


class _Pool:
    """Idle workers, and how many exist; a caller takes one for a job and gives it back."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.idle: list[_Worker] = []
        self.every: set[_Worker] = set()

    def take(self) -> _Worker:
        with self.cond:
            while True:
                while self.idle:
                    worker = self.idle.pop()
                    if not worker.dead():
                        return worker
                    self._drop(worker)
                if len(self.every) < pool_size():
                    worker = _Worker()
                    self.every.add(worker)
                    return worker
                self.cond.wait()

    def give_back(self, worker: _Worker) -> None:
        worker.jobs += 1
        if worker.jobs >= RECYCLE_AFTER_JOBS:
            self.discard(worker)  # the next job starts a fresh one
            return
        with self.cond:
            self.idle.append(worker)
            self.cond.notify()

    def discard(self, worker: _Worker) -> None:
        """Kill a worker that failed (timeout, EOF); a waiting caller may start another."""
        with contextlib.suppress(OSError):
            worker.kill()
        with self.cond:
            self._drop(worker)
            self.cond.notify()

    def _drop(self, worker: _Worker) -> None:
        self.every.discard(worker)
        if worker in self.idle:
            self.idle.remove(worker)


_pool = _Pool()


def _forget_workers_in_child() -> None:
    """A child forked from the caller must not talk to the caller's workers: it gets its own."""
    global _pool
    _pool = _Pool()


os.register_at_fork(after_in_child=_forget_workers_in_child)


def stop_workers() -> None:
    """Kill the idle workers and reap them (at exit; tests that need fresh workers)."""
    with _pool.cond:
        idle, _pool.idle = _pool.idle, []
        for worker in idle:
            _pool.every.discard(worker)
    for worker in idle:
        if not worker.dead():
            with contextlib.suppress(OSError):
                worker.kill()


atexit.register(stop_workers)


def worker_pids() -> list[int]:
    """The PIDs of the workers that exist now (tests, benchmarks)."""
    with _pool.cond:
        return sorted(worker.pid for worker in _pool.every)


def start_worker() -> None:
    """Start the pool's workers now, in parallel (each takes ~0.5 s to import pyroute2 and
    python-iptables), so that the first cuts do not pay for it."""
    taken = []
    try:
        for _ in range(pool_size()):
            with _pool.cond:
                if len(_pool.every) >= pool_size():
                    break
                worker = _Worker()
                _pool.every.add(worker)
            taken.append(worker)
        for worker in taken:
            try:
                worker.wait_ready()
            except (OSError, EOFError, TimeoutError) as exc:
                raise ApplyFailed(f"namespace worker did not start: {exc!r}") from None
    except BaseException:
        for worker in taken:
            _pool.discard(worker)
        raise
    for worker in taken:
        _pool.give_back(worker)


# The jobs' module, named rather than imported by callers: importing it loads python-iptables
# (and runs its library search, ~0.9 s and ~20 MB of RSS), which only the worker needs.
JOBS = "netcut.direct.executor"


def job(name: str) -> str:
    """A job of the worker's jobs module (direct/executor.py), by name: `run_in_netns` takes
    it in place of the function, and the worker looks it up."""
    return f"{JOBS}:{name}"


def run_in_netns(
    fd: int,
    func: Callable[..., T] | str,
    *args: Any,
    timeout: float = DEFAULT_TIMEOUT_S,
    before: Callable[[], None] | None = None,
) -> T:
    """Return `func(*args)` as run inside the namespace named by the open fd `fd`.

    `func` must be a module-level function (it is pickled by name), or `job(name)` for one of
    direct/executor.py's jobs, which the caller need not import. Exceptions it raises come
    back as themselves when they are NetcutErrors, as ApplyFailed otherwise. Raises
    ApplyFailed with `rolled_back` False when the worker dies or overruns `timeout` (it is
    then killed): whatever the job did so far stays done. `before` runs once a worker is
    free, right before the job is sent (a check as close to the job as it can be); what it
    raises is raised, with nothing sent.
    """
    worker = _pool.take()
    if before is not None:
        try:
            before()
        except BaseException:
            _pool.give_back(worker)
            raise
    try:
        status, value = worker.call(fd, func, args, timeout)
    except (OSError, EOFError, TimeoutError) as exc:
        _pool.discard(worker)
        if isinstance(exc, TimeoutError):
            msg = f"namespace worker did not answer within {timeout:g}s; killed"
        else:
            msg = f"namespace worker died mid-job ({exc!r})"
        note = "; nothing was rolled back: `netcut status` shows the namespace, `netcut restore`"
        raise ApplyFailed(
            msg + note + " undoes what the record says ran", rolled_back=False
        ) from None
    except BaseException:
        _pool.discard(worker)  # interrupted mid-call: its socket is out of step
        raise
    _pool.give_back(worker)
    if status == "ok":
        return value  # type: ignore[no-any-return]
    if isinstance(value, NetcutError):
        raise value
    raise ApplyFailed(f"{type(value).__name__}: {value}")


def _recv_exact(sock: socket.socket, n: int, deadline: float | None) -> bytes:
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([sock], [], [], left)[0]:
                raise TimeoutError
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _recv_msg(sock: socket.socket, deadline: float) -> Any:
    (size,) = _LEN.unpack(_recv_exact(sock, _LEN.size, deadline))
    return pickle.loads(_recv_exact(sock, size, deadline))


def serve(fileno: int) -> None:  # pragma: no cover - the worker's main, reports via the socket
    """The worker: answer jobs from the caller on socket `fileno` until it closes."""
    sock = socket.socket(fileno=fileno)
    code = 0
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the caller decides; we follow EOF
        home = os.open("/proc/self/ns/net", os.O_RDONLY)
        _warm_up()
        sock.sendall(b"R")
        while True:
            try:
                msg, fds, _, _ = socket.recv_fds(sock, _LEN.size, 1)
            except OSError:
                break
            if not msg:
                break
            if len(msg) < _LEN.size:
                msg += _recv_exact(sock, _LEN.size - len(msg), None)
            (size,) = _LEN.unpack(msg)
            func, args = pickle.loads(_recv_exact(sock, size, None))
            reply = _run_job(fds[0], func, args)
            # Go home: a worker parked in the target would hold it alive after `ip netns
            # del`, and would count as a privileged process inside it.
            setns(home)
            sock.sendall(_LEN.pack(len(reply)) + reply)
    except BaseException:
        code = 1
    finally:
        os._exit(code)


def _warm_up() -> None:  # pragma: no cover - runs in the worker
    """Load, once per worker, what every job needs: the executor's modules and the xtables
    extensions of the backstop (building rules opens no table)."""
    from netcut.direct import executor

    executor.NETFILTER.prewarm()


def _resolve(func: Callable[..., Any] | str) -> Callable[..., Any]:  # pragma: no cover
    """A job named by `job()`: only the jobs module's own functions are looked up."""
    if not isinstance(func, str):
        return func
    module, _, name = func.partition(":")
    if module != JOBS or not name.startswith("job_"):
        raise ApplyFailed(f"not a netcut job: {func!r}")
    import importlib

    found: Callable[..., Any] = getattr(importlib.import_module(module), name)
    return found


def _run_job(  # pragma: no cover
    fd: int, func: Callable[..., Any] | str, args: tuple[Any, ...]
) -> bytes:
    try:
        setns(fd)
        result: tuple[str, Any] = ("ok", _resolve(func)(*args))
    except Exception as exc:
        result = ("err", exc)
    finally:
        os.close(fd)
    try:
        return pickle.dumps(result)
    except Exception as exc:
        return pickle.dumps(("err", ApplyFailed(f"unpicklable answer: {exc!r}")))

"""Run a function inside a network namespace, in netcut's worker process, and return its result.

Why another process: setns(2) changes the calling thread only, python-iptables keeps its Table
and Chain objects (and libiptc its handles) process-wide, and pyroute2's synchronous API runs
an event loop of its own. A worker process that enters the namespace, does the work and answers
through a socket leaves the caller's namespace, netfilter state and event loop untouched.

Why one long-lived worker, started as a fresh interpreter: a fork per call costs ~4 ms for an
interpreter that has loaded pyroute2 and python-iptables, plus copy-on-write faults on every
page the child touches (a cut took ~30 ms that way, ~5 ms in a warm worker). A *forked* worker
would also inherit the caller's file descriptors (an embedding proxy's client sockets would not
close while the worker held copies), locks held by other threads, and garbage whose finalizers
could close the wrong fd. So the worker is a new `python` (exec, close_fds) started on first use
or by `start_worker()`; it serves one job at a time (a lock serializes callers), enters the
job's namespace by the fd passed with SCM_RIGHTS, drops python-iptables' cached tables before
each job, and goes back to its own namespace after it. A job that overruns `timeout` gets the
worker killed (the next call starts a fresh one), so a wedged kernel call cannot hang the
caller. The worker exits when the caller's end of the socket closes (the caller exited).
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
        code = f"from netcut.nsexec import serve; serve({child.fileno()})"
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

    def wait_ready(self) -> None:
        """The worker says `R` once it has imported what jobs need."""
        if not self.ready:
            if _recv_exact(self.sock, 1, time.monotonic() + READY_TIMEOUT_S) != b"R":
                raise EOFError("namespace worker sent garbage instead of ready")
            self.ready = True

    def call(self, fd: int, func: Callable[..., Any], args: tuple[Any, ...], timeout: float) -> Any:
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


_worker: _Worker | None = None
_lock = threading.Lock()


def _forget_worker_in_child() -> None:
    """A child forked from the caller must not talk to the caller's worker: it gets its own."""
    global _worker, _lock
    _worker, _lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_worker_in_child)


def _stop_worker_at_exit() -> None:
    """Reap the worker when the caller exits (no orphan, no unclosed socket)."""
    global _worker
    worker, _worker = _worker, None
    if worker is not None and not worker.dead():
        with contextlib.suppress(OSError):
            worker.kill()


atexit.register(_stop_worker_at_exit)


def start_worker() -> None:
    """Start the worker now (it takes ~0.5 s to import pyroute2 and python-iptables), so
    that the first cut does not pay for it."""
    global _worker
    with _lock:
        if _worker is None or _worker.dead():
            _worker = _Worker()
        try:
            _worker.wait_ready()
        except (OSError, EOFError, TimeoutError) as exc:
            _worker.kill()
            _worker = None
            raise ApplyFailed(f"namespace worker did not start: {exc!r}") from None


def run_in_netns(
    fd: int, func: Callable[..., T], *args: Any, timeout: float = DEFAULT_TIMEOUT_S
) -> T:
    """Return `func(*args)` as run inside the namespace named by the open fd `fd`.

    `func` must be a module-level function (it is pickled by name). Exceptions it raises come
    back as themselves when they are NetcutErrors, as ApplyFailed otherwise. Raises
    ApplyFailed when the worker dies or overruns `timeout` (the worker is then killed).
    """
    global _worker
    with _lock:
        if _worker is None or _worker.dead():
            _worker = _Worker()
        worker = _worker
        try:
            status, value = worker.call(fd, func, args, timeout)
        except (OSError, EOFError, TimeoutError) as exc:
            worker.kill()
            _worker = None
            if isinstance(exc, TimeoutError):
                msg = f"namespace worker did not answer within {timeout:g}s; killed"
                raise ApplyFailed(msg) from None
            raise ApplyFailed(f"namespace worker failed: {exc!r}") from None
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
    from netcut import apply, backstop  # noqa: F401 - imported for the jobs

    backstop.prewarm()


def _run_job(fd: int, func: Callable[..., Any], args: tuple[Any, ...]) -> bytes:  # pragma: no cover
    try:
        setns(fd)
        result: tuple[str, Any] = ("ok", func(*args))
    except Exception as exc:
        result = ("err", exc)
    finally:
        os.close(fd)
    try:
        return pickle.dumps(result)
    except Exception as exc:
        return pickle.dumps(("err", ApplyFailed(f"unpicklable answer: {exc!r}")))

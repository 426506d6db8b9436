"""Run a function inside a network namespace, in a forked child, and return its result.

Why a forked child: setns(2) changes the calling thread only, while python-iptables keeps its
tables (and libiptc its handles) process-wide, and pyroute2's synchronous API runs an event
loop of its own. A child that enters the namespace, does the work and exits leaves the
caller's namespace, tables and event loop untouched. The result (or the exception) comes back
pickled through a pipe; the child is killed when it overruns `timeout`, so a wedged kernel
call or a lock inherited at fork time cannot hang the caller.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import pickle
import select
import signal
import time
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

from netcut.errors import ApplyFailed, NetcutError, PrivilegeError

CLONE_NEWNET = 0x40000000
# A cut is a few dozen netlink and netfilter calls (~10 ms); 20 s means something is wedged.
DEFAULT_TIMEOUT_S = 20.0

T = TypeVar("T")
_libc = ctypes.CDLL(None, use_errno=True)


def ns_identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino)


def setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise PrivilegeError(f"setns into the target namespace failed: {os.strerror(err)}")


def run_in_netns(fd: int, func: Callable[..., T], *args: Any, timeout: float = DEFAULT_TIMEOUT_S) -> T:
    """Fork, enter the namespace `fd` in the child, return `func(*args)` from there.

    Exceptions raised by `func` are re-raised here (NetcutError subclasses as themselves,
    anything else as ApplyFailed). Raises ApplyFailed when the child dies or overruns.
    """
    rfd, wfd = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork with threads
        child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child, reported through the pipe
        os.close(rfd)
        _child_main(wfd, fd, func, args)
    os.close(wfd)
    data = None
    try:
        data = _read_all(rfd, time.monotonic() + timeout)
    finally:
        os.close(rfd)
        _reap(child, finished=data is not None)
    return _unpack(data, timeout)


def _child_main(wfd: int, fd: int, func: Callable[..., Any], args: tuple[Any, ...]) -> None:
    code = 0
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        asyncio.events._set_running_loop(None)  # the parent's loop is not ours
        setns(fd)
        payload = pickle.dumps(("ok", func(*args)))
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
        code = 1
        try:
            payload = pickle.dumps(("err", exc))
        except Exception:
            payload = pickle.dumps(("err", ApplyFailed(f"{type(exc).__name__}: {exc}")))
    try:
        view = memoryview(payload)
        while view:
            view = view[os.write(wfd, view) :]
    finally:
        os._exit(code)


def _read_all(rfd: int, deadline: float) -> bytes | None:
    chunks = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([rfd], [], [], left)[0]:
            return None
        chunk = os.read(rfd, 65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _reap(child: int, finished: bool) -> None:
    """Wait for a child that closed its pipe (it is exiting); kill one that overran."""
    if not finished:
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os.waitpid(child, 0)


def _unpack(data: bytes | None, timeout: float) -> Any:
    if data is None:
        raise ApplyFailed(f"the namespace worker did not finish within {timeout:g}s; killed")
    if not data:
        raise ApplyFailed("the namespace worker died without an answer")
    status, value = pickle.loads(data)
    if status == "ok":
        return value
    if isinstance(value, NetcutError):
        raise value
    raise ApplyFailed(f"{type(value).__name__}: {value}")

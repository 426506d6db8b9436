"""Open a socket inside another network namespace without moving the caller.

Strategy (docs/proxy.md#listening-inside-a-namespace-framework-route-forwarders): a
short-lived thread enters the target namespace with `setns(2)` — which changes the namespace
of that one thread only — creates and binds the socket there (`listener.listen_socket`), and
hands it back. A socket keeps the namespace it was created in, so the host process's event
loop can then serve it while every other thread stays where it was. The thread exits right
after, so no code of ours ever runs in the sandbox's namespace longer than a `bind()`.

Python 3.11 has no `os.setns`, so libc's is called through ctypes. Needs CAP_SYS_ADMIN.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import socket
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeAlias, TypeVar

from ..errors import EgressError
from ..validate import as_count, as_port
from .listener import BACKLOG, listen_socket

if TYPE_CHECKING:
    from netcut.targetref import TargetRef

CLONE_NEWNET = 0x40000000
T = TypeVar("T")
NamespaceLike: TypeAlias = "str | int | TargetRef"


class NamespaceError(EgressError):
    """The namespace cannot be entered (missing, or no privilege)."""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def namespace_path(ns: NamespaceLike) -> str:
    """The namespace file of `ns`, read by netcut's target parser so that both packages
    agree on every form (docs/netcut.md#targets): a name, a path, a PID (int, "pid:N" or a
    digit string), or a container ("docker:ID", ... : its task's PID, from its runtime).

    Raises NamespaceError for a value that names nothing or a target that does not exist."""
    # Imported here: `import egress` does not load netcut until a namespace is named.
    from netcut.errors import NetcutError
    from netcut.target import resolve_target

    try:
        return resolve_target(ns).path
    except NetcutError as exc:
        raise NamespaceError(f"network namespace {ns!r}: {exc}") from None


def call_in_netns_thread(ns: NamespaceLike, fn: Callable[[], T]) -> T:
    """Run `fn` in a fresh thread that has entered namespace `ns`; return its result.

    Raises `NamespaceError` if the namespace cannot be opened or entered; re-raises whatever
    `fn` raised.
    """
    path = namespace_path(ns)
    result: list[T] = []
    error: list[BaseException] = []

    def worker() -> None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            error.append(NamespaceError(f"cannot open network namespace {path!r}: {exc}"))
            return
        try:
            if _libc().setns(fd, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                error.append(
                    NamespaceError(f"cannot enter network namespace {path!r}: {os.strerror(err)}")
                )
                return
            result.append(fn())
        except BaseException as exc:  # handed back to the caller's thread
            error.append(exc)
        finally:
            os.close(fd)

    thread = threading.Thread(target=worker, name=f"netns:{path}", daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


def listen_in_netns(
    ns: NamespaceLike, host: str, port: int, *, backlog: int = BACKLOG
) -> socket.socket:
    """A listening TCP socket bound to `host:port` inside namespace `ns` (non-blocking)."""
    as_port(port, "listen_in_netns port")
    as_count(backlog, "listen_in_netns backlog")
    return call_in_netns_thread(ns, lambda: listen_socket(host, port, backlog))

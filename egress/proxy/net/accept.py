"""Accepting connections: the proxy's own accept loop on each listening socket.

Shell. Why not `loop.create_server` (docs/proxy.md#file-descriptors): uvloop accepts every
pending connection and only later tells the protocol, so a burst of connections cannot be
refused before each holds a descriptor, and when descriptors run out libuv accepts and
closes connections with no answer, no record and no log line; the stock loop logs a
traceback for every failed `accept`. Here each accepted socket is admitted or refused at
once (a refusal costs no transport and no task: its answer is written to the socket and it
is closed), and when descriptors are exhausted one reserved descriptor is let go to accept
the waiting connections one by one, answer each 503 and record it; the failure is logged
once per second with a count (`fdbudget.AcceptFailures`).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
from collections.abc import Callable
from typing import Final

from ..fdbudget import AcceptFailures

log = logging.getLogger("egress")

BATCH: Final = 8  # connections accepted per readiness callback: then others get the loop
SCARCE: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
PAUSE: Final = 0.25  # seconds to stop accepting when not even the reserve is left

Take = Callable[[socket.socket, object], None]


class Accepted(socket.socket):
    """An accepted connection's socket, its family and type those of its listener.

    Why: the stdlib's `socket.family` and `socket.type` convert the kernel's number to an
    enum on every read (~1-2 µs each), and a tunnel's accept read them five times (`accept`
    twice, uvloop's `connect_accepted_socket` three times): ~5 % of a tunnel's CPU
    (bench/profile.md). Here they are read once per listener."""

    __slots__ = ("_family", "_kind")

    def __init__(self, fd: int, family: socket.AddressFamily, kind: socket.SocketKind) -> None:
        super().__init__(family, kind, 0, fd)
        self._family = family
        self._kind = kind

    @property
    def family(self) -> socket.AddressFamily:
        return self._family

    @property
    def type(self) -> socket.SocketKind:
        return self._kind


def accept(
    sock: socket.socket, family: socket.AddressFamily, kind: socket.SocketKind
) -> tuple[Accepted, object]:
    """`sock.accept()`, as the stdlib does it (its `_accept`: accept4 with SOCK_CLOEXEC),
    the new socket an `Accepted`."""
    fd, addr = sock._accept()  # type: ignore[attr-defined]  # (socket.accept's own call)
    try:
        return Accepted(fd, family, kind), addr
    except BaseException:
        os.close(fd)
        raise


class Reserve:
    """One descriptor held back, let go of to accept (and refuse) when none is left."""

    __slots__ = ("fd",)

    def __init__(self) -> None:
        self.fd: int | None = None
        self.restore()

    def release(self) -> bool:
        if self.fd is None:
            return False
        os.close(self.fd)
        self.fd = None
        return True

    def restore(self) -> bool:
        if self.fd is None:
            try:
                self.fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return False
        return True

    def close(self) -> None:
        self.release()


LINGER: Final = 1.0  # seconds a refused connection may take to finish sending
LINGER_MAX: Final = 64  # refused connections lingering at once (descriptors are scarce)


class Lingering:
    """Refused sockets, answered and shut for writing, closed once the client has finished
    sending (or after `LINGER`): closing with unread bytes sends a reset, and the client
    then loses the answer (nginx's lingering close, bounded)."""

    __slots__ = ("loop", "open")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.open = 0

    def close(self, sock: socket.socket) -> None:
        if self.open >= LINGER_MAX:
            sock.close()
            return
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            sock.close()
            return
        fd = sock.fileno()
        self.open += 1
        timer: list[asyncio.TimerHandle] = []

        def done() -> None:
            if sock.fileno() < 0:
                return
            self.loop.remove_reader(fd)
            timer[0].cancel()
            sock.close()
            self.open -= 1

        def readable() -> None:
            try:
                data = sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if not data:
                done()

        timer.append(self.loop.call_later(LINGER, done))
        self.loop.add_reader(fd, readable)


class Acceptor:
    """Accepts on one listening socket: `take` admits or refuses a new connection,
    `refuse` answers one accepted while descriptors are exhausted."""

    __slots__ = (
        "_family",
        "_kind",
        "_paused",
        "failures",
        "loop",
        "refuse",
        "reserve",
        "sock",
        "take",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        take: Take,
        refuse: Take,
        reserve: Reserve,
        failures: AcceptFailures,
    ) -> None:
        self.loop = loop
        self.sock = sock
        self.take = take
        self.refuse = refuse
        self.reserve = reserve
        self.failures = failures
        self._paused: asyncio.TimerHandle | None = None
        self._family = sock.family  # (read once: `Accepted`)
        self._kind = sock.type

    def start(self) -> None:
        self._paused = None
        if self.sock.fileno() >= 0:
            self.loop.add_reader(self.sock.fileno(), self._ready)

    def hold(self, seconds: float) -> None:
        """Stop accepting for `seconds`: new connections wait in the kernel's backlog (a
        sandbox's own listener while that sandbox is at its cap: each accept would only be
        refused, at the other sandboxes' expense)."""
        if self._paused is None and self.sock.fileno() >= 0:
            self.loop.remove_reader(self.sock.fileno())
            self._paused = self.loop.call_later(seconds, self.start)

    def close(self) -> None:
        if self._paused is not None:
            self._paused.cancel()
            self._paused = None
        if self.sock.fileno() >= 0:
            self.loop.remove_reader(self.sock.fileno())
            self.sock.close()

    def _ready(self) -> None:
        sock = self.sock
        for _ in range(BATCH):
            if self._paused is not None:
                return
            try:
                conn, addr = accept(sock, self._family, self._kind)
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                self._failed(exc)
                if exc.errno in SCARCE:
                    self._exhausted()
                return
            self.take(conn, addr)

    def _exhausted(self) -> None:
        """Answer the waiting connections with the reserved descriptor, one at a time."""
        sock = self.sock
        for _ in range(BATCH):
            if not self.reserve.release():
                break
            try:
                conn, addr = sock.accept()
            except (BlockingIOError, InterruptedError):
                self.reserve.restore()
                return
            except OSError as exc:
                self.reserve.restore()
                self._failed(exc)
                break
            self.refuse(conn, addr)
            if not self.reserve.restore():
                break
        else:
            return  # more may wait: the next readiness callback goes on
        # nothing left to accept with: stop reading the socket for a moment, not spin on it
        self.hold(PAUSE)

    def _failed(self, exc: OSError) -> None:
        count = self.failures.failed(self.loop.time())
        if count is not None:
            log.error(
                "egress: accept failed %d time(s) in the last second: %s "
                "(docs/proxy.md#file-descriptors)",
                count,
                exc,
            )


__all__ = ["Accepted", "Acceptor", "Lingering", "Reserve", "accept"]

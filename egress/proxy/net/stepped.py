"""One of the event loop's own coroutines, run from callbacks instead of a task.

Shell. Some of the loop's operations exist only as coroutines: making a transport of an
accepted socket (`loop.connect_accepted_socket`) and dialing (`loop.create_connection`).
uvloop's do their work in C and wait once (for the connect, or for `connection_made`);
a `Task` around them would cost a scheduling step, a context copy and a wake-up per
connection, and `asyncio.timeout` a timer more (docs/architecture.md#the-callback-driver).
`Stepped` sends into the coroutine by hand and resumes it from the done callback of the
future it waits on, until it returns; `cancel` cancels that future and throws
CancelledError into the coroutine, which makes the loop's coroutine undo its work (close the
socket or transport it made) as a cancelled task's would, and in the same order: the
future's own callbacks first. A dial's socket must leave the selector before it is closed:
closed first, the standard loop kept its fd registered, and the next socket given that fd
number waited for writability that was never watched (the next address of a dial, or any
later connection's full write buffer, hung).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

Then = Callable[[Any, BaseException | None], None]


class Stepped:
    """`coro` run to its end from callbacks: `then(result, None)` or `then(None, error)`,
    exactly once, unless cancelled first."""

    __slots__ = ("_coro", "_loop", "_then", "_waiting")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], then: Then
    ) -> None:
        self._loop = loop
        self._coro = coro
        self._then: Then | None = then
        self._waiting: asyncio.Future[Any] | None = None

    def start(self) -> None:
        """Run it up to its first wait (`then` may be called before this returns)."""
        self._step(None)

    def _step(self, _: object) -> None:
        if self._then is None:
            return
        try:
            waiting = self._coro.send(None)
        except StopIteration as stop:
            self._end(stop.value, None)
            return
        except Exception as exc:
            self._end(None, exc)
            return
        if isinstance(waiting, asyncio.Future):
            self._waiting = waiting
            waiting.add_done_callback(self._step)
        else:  # a bare yield (`asyncio.sleep(0)`): resume on the next turn
            self._waiting = None
            self._loop.call_soon(self._step, None)

    def _end(self, result: object, err: BaseException | None) -> None:
        then, self._then = self._then, None
        if then is not None:
            then(result, err)

    def cancel(self) -> None:
        """Stop waiting, as a task's cancel does: the future it waits on is cancelled, and once
        that future's own callbacks ran (a connect's: its socket leaves the selector), the
        coroutine gets CancelledError and cleans up (closes what it made). `then` is not
        called."""
        if self._then is None:
            return
        self._then = None
        waiting = self._waiting
        if waiting is not None and not waiting.done():
            waiting.remove_done_callback(self._step)
            waiting.add_done_callback(self._unwind)  # after the loop's own callbacks
            waiting.cancel()
        else:  # already resumable: after what is already scheduled
            self._loop.call_soon(self._unwind, None)

    def _unwind(self, _: object) -> None:
        try:
            self._coro.throw(asyncio.CancelledError())
        except (asyncio.CancelledError, Exception):
            return  # CancelledError back, or its clean-up's own error: it ended either way
        self._coro.close()  # it waited again while cleaning up: no one will resume it


def adopt(
    loop: asyncio.AbstractEventLoop, sock: Any, protocol: asyncio.Protocol, then: Then
) -> Stepped:
    """Make `sock` (accepted, or connected) a transport feeding `protocol`; started."""
    stepped = Stepped(loop, loop.connect_accepted_socket(lambda: protocol, sock), then)
    stepped.start()
    return stepped


__all__ = ["Stepped", "Then", "adopt"]

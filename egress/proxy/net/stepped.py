"""One of the event loop's own coroutines, run from callbacks instead of a task.

Shell. Some of the loop's operations exist only as coroutines: making a transport of an
accepted socket (`loop.connect_accepted_socket`) and dialing (`loop.create_connection`).
uvloop's do their work in C and wait once (for the connect, or for `connection_made`);
a `Task` around them would cost a scheduling step, a context copy and a wake-up per
connection, and `asyncio.timeout` a timer more (docs/architecture.md#the-callback-driver).
`Stepped` sends into the coroutine by hand and resumes it from the done callback of the
future it waits on, until it returns; `cancel` closes it, which makes the loop's coroutine
undo its work (close the transport it made) as a cancelled task's would.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

Then = Callable[[Any, BaseException | None], None]


class Stepped:
    """`coro` run to its end from callbacks: `then(result, None)` or `then(None, error)`,
    exactly once, unless cancelled first."""

    __slots__ = ("_coro", "_loop", "_then")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], then: Then
    ) -> None:
        self._loop = loop
        self._coro = coro
        self._then: Then | None = then

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
            waiting.add_done_callback(self._step)
        else:  # a bare yield (`asyncio.sleep(0)`): resume on the next turn
            self._loop.call_soon(self._step, None)

    def _end(self, result: object, err: BaseException | None) -> None:
        then, self._then = self._then, None
        if then is not None:
            then(result, err)

    def cancel(self) -> None:
        """Stop waiting: the coroutine is closed (its own clean-up runs), `then` is not called."""
        if self._then is not None:
            self._then = None
            self._coro.close()


def adopt(
    loop: asyncio.AbstractEventLoop, sock: Any, protocol: asyncio.Protocol, then: Then
) -> Stepped:
    """Make `sock` (accepted, or connected) a transport feeding `protocol`; started."""
    stepped = Stepped(loop, loop.connect_accepted_socket(lambda: protocol, sock), then)
    stepped.start()
    return stepped


__all__ = ["Stepped", "Then", "adopt"]

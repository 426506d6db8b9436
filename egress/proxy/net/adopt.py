"""A connected socket made a transport of the loop's, from a callback (no task).

Shell. The event loop's only public way to wrap a socket it did not connect itself is the
coroutine `loop.connect_accepted_socket` (uvloop's and the stock loop's alike). Both build
the transport and schedule `connection_made` on the first step and then only wait for that
call: so the coroutine is stepped here by hand, and resumed by the waiter's done callback,
instead of becoming a `Task` of its own (a task costs a scheduling step, a context and a
wake-up per connection: docs/architecture.md#the-callback-driver).

The coroutine must be resumed, never dropped: closing it while it waits closes the
transport it has just made.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Coroutine
from typing import Any

Adopted = Callable[[BaseException | None], None]


def adopt(
    loop: asyncio.AbstractEventLoop,
    sock: socket.socket,
    protocol: asyncio.Protocol,
    then: Adopted | None = None,
) -> BaseException | None:
    """Make `sock` (connected, non-blocking) a transport feeding `protocol`.

    Returns the error if the transport could not be made (the socket is then the caller's
    to close); else `protocol.connection_made` follows from the loop, and `then(None)` (or
    `then(error)`) once the loop's coroutine has finished."""
    coro: Coroutine[Any, Any, Any] = loop.connect_accepted_socket(lambda: protocol, sock)
    try:
        waiter = coro.send(None)
    except StopIteration:
        if then is not None:
            then(None)
        return None
    except Exception as exc:  # OSError from the loop's own set-up (a closed descriptor)
        return exc

    def resume(_: object) -> None:
        try:
            coro.send(None)
        except StopIteration:
            err: BaseException | None = None
        except Exception as exc:
            err = exc
        else:  # it waited a second time: not the coroutine this module was written for
            coro.close()
            err = RuntimeError("connect_accepted_socket waited twice")
        if then is not None:
            then(err)

    if not isinstance(waiter, asyncio.Future):  # a bare yield: resume on the next turn
        loop.call_soon(resume, None)
    else:
        waiter.add_done_callback(resume)
    return None


__all__ = ["Adopted", "adopt"]

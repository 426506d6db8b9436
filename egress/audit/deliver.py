"""`Delivery`: hooks and `events()` consumers, given every record `AuditLog` writes.

Shell (schedules on the event loop). A record reaches them redacted, on the loop's thread
(a record made on another thread is handed over with `call_soon_threadsafe`); a hook's
coroutine result becomes a task; a hook that raises is logged and counted, never raised
into the proxy. Each `events()` consumer is a bounded deque that drops its oldest entry
when full (docs/audit-log.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable

logger = logging.getLogger("egress.audit")

Hook = Callable[[dict[str, object]], object]


class Delivery:
    """The hooks and consumers of one `AuditLog`."""

    def __init__(self, events_maxlen: int) -> None:
        self.events_maxlen = events_maxlen
        self.events_dropped = 0
        self.hook_errors = 0
        self.hooks: list[Hook] = []
        self.subscribers: list[_Subscriber] = []
        self.tasks: set[asyncio.Task[object]] = set()
        self.loop: asyncio.AbstractEventLoop | None = None  # set by AuditLog.start()
        self.loop_thread = 0

    def subscribe(self, closed: bool) -> AsyncIterator[dict[str, object]]:
        subscriber = _Subscriber(self)
        self.subscribers.append(subscriber)
        if closed:
            subscriber.close()
        return subscriber.iterate()

    def deliver(self, rec: dict[str, object]) -> None:
        if threading.get_ident() != self.loop_thread and self.loop is not None:
            self.loop.call_soon_threadsafe(self._deliver_here, rec)
        else:
            self._deliver_here(rec)

    async def close(self) -> None:
        """End every consumer's iteration and wait for the hooks' tasks."""
        for subscriber in list(self.subscribers):
            subscriber.close()
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)

    def _deliver_here(self, rec: dict[str, object]) -> None:
        for subscriber in self.subscribers:
            subscriber.put(rec)
        for hook in self.hooks:
            try:
                result = hook(rec)
            except Exception:
                self._hook_failed()
                continue
            if inspect.isawaitable(result):
                try:
                    task = asyncio.ensure_future(result)
                except RuntimeError:  # recorded before start(): no loop to run it on
                    self._hook_failed()
                    continue
                self.tasks.add(task)
                task.add_done_callback(self._hook_done)

    def _hook_done(self, task: asyncio.Future[object]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._hook_failed(task.exception())

    def _hook_failed(self, exc: BaseException | None = None) -> None:
        self.hook_errors += 1
        if self.hook_errors <= 10:
            logger.error("audit hook failed (%d so far)", self.hook_errors, exc_info=exc or True)


class _Subscriber:
    """One events() consumer: a bounded deque that drops its oldest entry when full."""

    def __init__(self, owner: Delivery) -> None:
        self._owner = owner
        self._items: deque[dict[str, object] | None] = deque()
        self._wakeup = asyncio.Event()

    def put(self, rec: dict[str, object] | None) -> None:
        if rec is not None and len(self._items) >= self._owner.events_maxlen:
            self._items.popleft()
            self._owner.events_dropped += 1
        self._items.append(rec)
        self._wakeup.set()

    def close(self) -> None:
        self.put(None)

    async def iterate(self) -> AsyncIterator[dict[str, object]]:
        try:
            while True:
                while not self._items:
                    self._wakeup.clear()
                    await self._wakeup.wait()
                item = self._items.popleft()
                if item is None:
                    return
                yield item
        finally:
            with contextlib.suppress(ValueError):
                self._owner.subscribers.remove(self)


__all__ = ["Delivery", "Hook"]

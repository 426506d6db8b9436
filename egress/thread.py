"""Run an `EgressProxy` on its own event loop in a background thread (synchronous callers).

The proxy is fully asyncio; a synchronous framework gets the same object behind a thread:
`start()` returns once the proxy accepts (or raises what `EgressProxy.start` raised), `stop()`
shuts it down gracefully (audit log flushed) and joins the thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any

from .proxy.server import EgressProxy


class ProxyThread:
    """`with ProxyThread(lambda: EgressProxy(policy, ...)) as proxy: proxy.url`.

    The factory runs on the thread's own loop, so the proxy (and an `AuditLog` it builds)
    belong to that loop. `audit` objects with `start()`/`aclose()` are started and closed too.
    """

    def __init__(self, factory: Callable[[], EgressProxy], *, audit: Any = None) -> None:
        self._factory = factory
        self._audit = audit
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None
        self._ready: concurrent.futures.Future[EgressProxy] = concurrent.futures.Future()
        self.proxy: EgressProxy | None = None

    def __enter__(self) -> EgressProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 30.0) -> EgressProxy:
        self._thread = threading.Thread(target=self._run, name="egress-proxy", daemon=True)
        self._thread.start()
        self.proxy = self._ready.result(timeout)
        return self.proxy

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            if self._audit is not None:
                await self._audit.start()
            proxy = self._factory()
            await proxy.start()
        except BaseException as exc:
            self._ready.set_exception(exc)
            return
        self._ready.set_result(proxy)
        try:
            await self._stop.wait()
        finally:
            await proxy.stop()
            if self._audit is not None:
                await self._audit.aclose()

    def stop(self, timeout: float = 30.0) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout)

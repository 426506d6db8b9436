"""Name resolution for the proxy: pins first, then the system resolver, off the event loop.

The answer is returned as a tuple of canonical addresses which the caller checks with the
address guard and then dials *those* addresses: a name is never resolved twice for one
decision, so a rebinding DNS answer cannot slip between check and connect. A short positive
cache (`ttl`, default 10 s) saves a thread-pool round trip per request; cached answers are
checked again on every use like fresh ones.

Bounds (docs/proxy.md#limits), so a name whose DNS never answers cannot stall anyone else:

- each lookup waits at most `timeout` seconds (default 5 s), then fails with
  `ResolveTimeout` (reason `dns_timeout`);
- lookups run on a thread pool of the resolver's own (`workers` threads, default 16), never
  the event loop's default executor, which embedding code (netcut's async calls) shares;
  a lookup that would have to queue behind `workers` unfinished ones fails at once with
  `dns_timeout` instead (a thread stuck in `getaddrinfo` cannot be cancelled, so queueing
  would let a few dead names stall every other one; such a refusal is not remembered);
- concurrent lookups of one name share one thread;
- a failure (timeout or error) is remembered for `negative_ttl` seconds (default 2 s), so a
  dead name costs at most one thread per `negative_ttl`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

from ...policy.target import IPAddress, canonical_addresses
from ...validate import as_count, as_timeout

Lookup = Callable[[str], Iterable[str]]
V = TypeVar("V")


class ResolveError(Exception):
    """The name did not resolve (NXDOMAIN, no address, resolver failure)."""

    reason = "dns_error"


class ResolveTimeout(ResolveError):
    """The resolver did not answer within the timeout, or is saturated by ones that did not."""

    reason = "dns_timeout"


class ResolverBusy(ResolveTimeout):
    """Every thread is taken by unanswered lookups: refused at once, and not remembered
    against the name (it says nothing about the name)."""


def system_lookup(host: str) -> list[str]:
    """The system resolver (`getaddrinfo`, blocking): the address texts for `host`."""
    return [str(info[4][0]) for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)]


class Resolver:
    def __init__(
        self,
        pins: Mapping[str, tuple[IPAddress, ...]] | None = None,
        *,
        ttl: float = 10.0,
        max_entries: int = 4096,
        timeout: float = 5.0,
        negative_ttl: float = 2.0,
        workers: int = 16,
        lookup: Lookup = system_lookup,
    ) -> None:
        self.pins = dict(pins or {})
        self.ttl = as_timeout(ttl, "Resolver ttl")
        self.max_entries = as_count(max_entries, "Resolver max_entries")
        self.timeout = as_timeout(timeout, "Resolver timeout")
        self.negative_ttl = as_timeout(negative_ttl, "Resolver negative_ttl")
        self.workers = as_count(workers, "Resolver workers")
        self._lookup = lookup
        self._cache: dict[str, tuple[float, tuple[IPAddress, ...]]] = {}
        self._failed: dict[str, tuple[float, ResolveError]] = {}
        self._inflight: dict[str, asyncio.Future[list[str]]] = {}
        self._busy = 0
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None

    def cached(self, host: str) -> tuple[IPAddress, ...] | None:
        """The answer `resolve` would give at once (a pin or an unexpired cache entry), or
        None when it would have to look up or raise."""
        pinned = self.pins.get(host)
        if pinned is not None:
            return pinned
        hit = self._cache.get(host)
        if hit is not None and hit[0] > time.monotonic():
            return hit[1]
        return None

    async def resolve(self, host: str) -> tuple[IPAddress, ...]:
        """Addresses for canonical `host` (pins first); raise `ResolveError` (`ResolveTimeout`
        when the answer did not come in time)."""
        pinned = self.pins.get(host)
        if pinned is not None:
            return pinned
        now = time.monotonic()
        hit = self._cache.get(host)
        if hit is not None and hit[0] > now:
            return hit[1]
        failed = self._failed.get(host)
        if failed is not None and failed[0] > now:
            raise failed[1]
        try:
            addrs = await self._lookup_bounded(host)
        except ResolverBusy:
            raise
        except ResolveError as exc:
            self._remember(self._failed, host, (now + self.negative_ttl, exc))
            raise
        self._failed.pop(host, None)
        self._remember(self._cache, host, (now + self.ttl, addrs))
        return addrs

    def _remember(self, table: dict[str, V], host: str, value: V) -> None:
        if len(table) >= self.max_entries:
            table.clear()
        table[host] = value

    async def _lookup_bounded(self, host: str) -> tuple[IPAddress, ...]:
        fut = self._inflight.get(host) or self._submit(host)
        try:
            async with asyncio.timeout(self.timeout):
                texts = await asyncio.shield(fut)
        except TimeoutError:
            raise ResolveTimeout(
                f"cannot resolve {host!r}: no answer within {self.timeout:g} s"
            ) from None
        except (socket.gaierror, UnicodeError, OSError) as exc:
            raise ResolveError(f"cannot resolve {host!r}: {exc}") from None
        addrs = canonical_addresses(texts)
        if not addrs:
            raise ResolveError(f"cannot resolve {host!r}: no address")
        return addrs

    def _submit(self, host: str) -> asyncio.Future[list[str]]:
        """Start one lookup on our own pool, or refuse at once if every thread is taken."""
        if self._busy >= self.workers:
            raise ResolverBusy(
                f"cannot resolve {host!r}: {self._busy} lookups unanswered (resolver busy)"
            )
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                self.workers, thread_name_prefix="egress-dns"
            )
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(self._executor, self._run_lookup, host)
        self._busy += 1
        self._inflight[host] = fut
        fut.add_done_callback(lambda f: self._finished(host, f))
        return fut

    def _run_lookup(self, host: str) -> list[str]:
        return list(self._lookup(host))

    def _finished(self, host: str, fut: asyncio.Future[list[str]]) -> None:
        self._busy -= 1
        if self._inflight.get(host) is fut:
            del self._inflight[host]
        if not fut.cancelled():
            fut.exception()  # retrieved: a waiter that timed out will not read it

    @property
    def busy(self) -> int:
        """Lookups started and not finished (including ones whose waiters timed out)."""
        return self._busy

    def close(self) -> None:
        """Stop the pool without waiting for lookups stuck in the system resolver."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

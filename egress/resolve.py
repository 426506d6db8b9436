"""Name resolution for the proxy: pins first, then the system resolver, off the event loop.

The answer is returned as a tuple of canonical addresses which the caller checks with the
address guard and then dials *those* addresses: a name is never resolved twice for one
decision, so a rebinding DNS answer cannot slip between check and connect. A short positive
cache (`ttl`, default 10 s) saves a thread-pool round trip per request; cached answers are
checked again on every use like fresh ones.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Mapping

from .target import IPAddress, canonical_addresses


class ResolveError(Exception):
    """The name did not resolve (NXDOMAIN, no address, resolver failure)."""


class Resolver:
    def __init__(
        self,
        pins: Mapping[str, tuple[IPAddress, ...]] | None = None,
        *,
        ttl: float = 10.0,
        max_entries: int = 4096,
    ) -> None:
        self.pins = dict(pins or {})
        self.ttl = ttl
        self.max_entries = max_entries
        self._cache: dict[str, tuple[float, tuple[IPAddress, ...]]] = {}

    async def resolve(self, host: str) -> tuple[IPAddress, ...]:
        """Addresses for canonical `host` (pins first); raise `ResolveError`."""
        pinned = self.pins.get(host)
        if pinned is not None:
            return pinned
        now = time.monotonic()
        hit = self._cache.get(host)
        if hit is not None and hit[0] > now:
            return hit[1]
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError, OSError) as exc:
            raise ResolveError(f"cannot resolve {host!r}: {exc}") from None
        addrs = canonical_addresses(info[4][0] for info in infos)
        if not addrs:
            raise ResolveError(f"cannot resolve {host!r}: no address")
        if len(self._cache) >= self.max_entries:
            self._cache.clear()
        self._cache[host] = (now + self.ttl, addrs)
        return addrs

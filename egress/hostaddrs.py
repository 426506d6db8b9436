"""Thin I/O: the addresses assigned to this host's interfaces (for the address guard).

The host behind a container's gateway is as sensitive as its loopback, so every address on
every interface of the proxy's own network namespace is reserved (SPEC 3). Read via netlink
(pyroute2). The synchronous `IPRoute` cannot run inside a running event loop, so async callers
use `local_addresses_async`, which runs it in a worker thread.
"""

from __future__ import annotations

import asyncio
import ipaddress

from .target import IPAddress, canonical_ip


def local_addresses() -> frozenset[IPAddress]:
    """Every address on this namespace's interfaces (v4 and v6, zone ids dropped)."""
    from pyroute2 import IPRoute

    found: set[IPAddress] = set()
    with IPRoute() as ipr:
        for msg in ipr.get_addr():
            value = msg.get_attr("IFA_ADDRESS") or msg.get_attr("IFA_LOCAL")
            if value:
                found.add(canonical_ip(ipaddress.ip_address(value.split("%", 1)[0])))
    return frozenset(found)


async def local_addresses_async() -> frozenset[IPAddress]:
    """`local_addresses` off the event loop."""
    return await asyncio.to_thread(local_addresses)

"""Where the host is as a sandbox sees it, and the sandbox's own addresses: read inside its
namespace (direct mode) or from its runtime's `inspect` (helper mode,
docs/user-guide.md#helper-mode). Gateway mode listens there and admits those sources."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from typing import Any

from netcut.targetref import parse_target

from ..policy.target import IPNetwork
from .execution import (
    ExecutionNotReady,
    not_ready_kind,
)

Network = IPNetwork


async def sandbox_sources(sandbox: str) -> tuple[Network, ...]:
    """The sandbox's own non-loopback addresses, as /32 (/128) source networks."""
    import asyncio

    from ..proxy.net.hostaddrs import local_addresses
    from ..proxy.net.netns import call_in_netns_thread

    found = await asyncio.to_thread(call_in_netns_thread, sandbox, local_addresses)
    return tuple(
        ipaddress.ip_network(a)
        for a in sorted(found, key=str)
        if not (a.is_loopback or a.is_link_local or a.is_unspecified)
    )


async def container_network(sandbox: str) -> Any:
    """The container's networks as its runtime's `inspect` reports them (netcut.helper.mode
    .ContainerNetwork), asked off the event loop; a netcut error is ExecutionNotReady."""
    from netcut import NetcutError
    from netcut.helper import mode as helper

    try:
        return await asyncio.to_thread(helper.inspect_network, parse_target(sandbox))
    except NetcutError as exc:
        raise ExecutionNotReady(f"sandbox {sandbox}: {exc}", not_ready_kind(exc)) from exc


def inspected_gateway(sandbox: str, net: Any) -> str:
    """The one IPv4 gateway the runtime reports; none, or several (a container on two
    networks), is ExecutionNotReady asking for `gateway=`."""
    gateways: tuple[str, ...] = net.gateways
    if len(gateways) != 1:
        seen = ", ".join(gateways) or "none"
        raise ExecutionNotReady(
            f"sandbox {sandbox}: its runtime reports {len(gateways)} IPv4 gateways ({seen}); "
            "pass gateway= to choose the address the proxy listens on",
            "no_gateway",
        )
    return gateways[0]


def inspected_sources(net: Any) -> tuple[Network, ...]:
    """The sandbox's addresses from `inspect`, as /32 (/128) source networks."""
    return tuple(ipaddress.ip_network(a) for a in net.addresses)


async def gateway_of(sandbox: str) -> str:
    """The IPv4 gateway of the sandbox's default route (the host as the sandbox sees it)."""
    import asyncio

    from ..proxy.net.netns import call_in_netns_thread

    def read() -> str | None:
        # netcut's rtnetlink client, not pyroute2.IPRoute (netcut/direct/rtnl.py says why)
        from netcut.direct.rtnl import Rtnl

        with Rtnl() as rtnl:
            for route in rtnl.dump_routes():
                main = route.get_attr("RTA_TABLE") in (None, 254)
                if route["family"] == socket.AF_INET and route["dst_len"] == 0 and main:
                    gw = route.get_attr("RTA_GATEWAY")
                    if gw:
                        return str(gw)
        return None

    gw = await asyncio.to_thread(call_in_netns_thread, sandbox, read)
    if gw is None:
        raise ExecutionNotReady(
            f"sandbox {sandbox}: no IPv4 default route to find the host by", "no_gateway"
        )
    ipaddress.ip_address(gw)
    return gw

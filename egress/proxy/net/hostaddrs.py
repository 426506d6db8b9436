"""Thin I/O: the addresses assigned to this host's interfaces (for the address guard).

The host behind a container's gateway is as sensitive as its loopback, so every address on
every interface of the proxy's own network namespace is reserved
(docs/proxy.md#the-address-guard). They are read with
one netlink `RTM_GETADDR` dump over a plain `AF_NETLINK` socket: a few dozen lines of
`struct`, where pyroute2 would cost the long-running proxy ~6 MB of resident memory and an
event loop of its own per call. Async callers use `local_addresses_async` (a worker thread).
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
import struct

from ...policy.target import IPAddress, canonical_ip

NETLINK_ROUTE = 0
RTM_GETADDR = 22
RTM_NEWADDR = 20
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLM_F_REQUEST = 0x1
NLM_F_DUMP = 0x300
IFA_ADDRESS = 1
IFA_LOCAL = 2

_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_IFADDRMSG = struct.Struct("=BBBBI")  # family, prefixlen, flags, scope, index
_RTATTR = struct.Struct("=HH")  # len, type


class NetlinkError(OSError):
    """The kernel answered the address dump with an error."""


def _align(n: int) -> int:
    return (n + 3) & ~3


def parse_addr_dump(data: bytes) -> tuple[list[IPAddress], bool]:
    """Addresses in one receive buffer of an RTM_GETADDR dump, and whether it was the last.

    Pure (exposed for tests): raises `NetlinkError` for an NLMSG_ERROR with a non-zero code.
    """
    found: list[IPAddress] = []
    offset = 0
    while offset + _NLMSGHDR.size <= len(data):
        length, kind, _, _, _ = _NLMSGHDR.unpack_from(data, offset)
        if length < _NLMSGHDR.size or offset + length > len(data):
            break
        body = offset + _NLMSGHDR.size
        if kind == NLMSG_DONE:
            return found, True
        if kind == NLMSG_ERROR:
            code = struct.unpack_from("=i", data, body)[0]
            if code:
                raise NetlinkError(-code, os.strerror(-code))
            return found, True
        if kind == RTM_NEWADDR:
            found.extend(_addresses(data, body, offset + length))
        offset += _align(length)
    return found, False


def _addresses(data: bytes, start: int, end: int) -> list[IPAddress]:
    family = data[start]
    size = 4 if family == socket.AF_INET else 16 if family == socket.AF_INET6 else 0
    out: list[IPAddress] = []
    pos = start + _IFADDRMSG.size
    while size and pos + _RTATTR.size <= end:
        alen, atype = _RTATTR.unpack_from(data, pos)
        if alen < _RTATTR.size:
            break
        if atype in (IFA_ADDRESS, IFA_LOCAL) and alen - _RTATTR.size == size:
            raw = data[pos + _RTATTR.size : pos + alen]
            out.append(canonical_ip(ipaddress.ip_address(raw)))
        pos += _align(alen)
    return out


def local_addresses() -> frozenset[IPAddress]:
    """Every address on this namespace's interfaces (v4 and v6). Raises OSError."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE) as sock:
        sock.bind((0, 0))
        request = _NLMSGHDR.pack(
            _NLMSGHDR.size + _IFADDRMSG.size, RTM_GETADDR, NLM_F_REQUEST | NLM_F_DUMP, 1, 0
        ) + _IFADDRMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
        sock.sendto(request, (0, 0))
        found: set[IPAddress] = set()
        done = False
        while not done:
            addrs, done = parse_addr_dump(sock.recv(65536))
            found.update(addrs)
    return frozenset(found)


async def local_addresses_async() -> frozenset[IPAddress]:
    """`local_addresses` off the event loop."""
    return await asyncio.to_thread(local_addresses)

"""The netlink address dump: parsed from bytes (pure), and read from this namespace."""

import socket
import struct

import pytest

from egress.proxy.net.hostaddrs import (
    IFA_ADDRESS,
    IFA_LOCAL,
    NLMSG_DONE,
    NLMSG_ERROR,
    RTM_NEWADDR,
    NetlinkError,
    local_addresses,
    parse_addr_dump,
)


def nlmsg(kind: int, body: bytes) -> bytes:
    length = 16 + len(body)
    pad = b"\0" * ((4 - length % 4) % 4)
    return struct.pack("=IHHII", length, kind, 0, 1, 0) + body + pad


def rtattr(kind: int, data: bytes) -> bytes:
    length = 4 + len(data)
    return struct.pack("=HH", length, kind) + data + b"\0" * ((4 - length % 4) % 4)


def addrmsg(family: int, *attrs: bytes) -> bytes:
    return nlmsg(RTM_NEWADDR, struct.pack("=BBBBI", family, 24, 0, 0, 2) + b"".join(attrs))


MAPPED_LOOPBACK = b"\0" * 10 + b"\xff\xff" + bytes([127, 0, 0, 1])


def test_parse_dump() -> None:
    data = (
        addrmsg(
            socket.AF_INET,
            rtattr(IFA_ADDRESS, bytes([198, 18, 0, 1])),
            rtattr(IFA_LOCAL, bytes([198, 18, 0, 1])),
            rtattr(3, b"eth0\0"),
        )
        + addrmsg(socket.AF_INET6, rtattr(IFA_ADDRESS, bytes(15) + b"\x01"))
        + addrmsg(socket.AF_INET6, rtattr(IFA_ADDRESS, MAPPED_LOOPBACK))
        + nlmsg(NLMSG_DONE, struct.pack("=i", 0))
    )
    found, done = parse_addr_dump(data)
    assert done
    assert [str(a) for a in found] == ["198.18.0.1", "198.18.0.1", "::1", "127.0.0.1"]


def test_parse_partial_and_garbage() -> None:
    part = addrmsg(socket.AF_INET, rtattr(IFA_ADDRESS, bytes([10, 0, 0, 1])))
    assert parse_addr_dump(part)[1] is False
    assert parse_addr_dump(part[:10]) == ([], False)
    assert parse_addr_dump(b"\xff" * 40) == ([], False)


def test_parse_error() -> None:
    with pytest.raises(NetlinkError):
        parse_addr_dump(nlmsg(NLMSG_ERROR, struct.pack("=i", -1) + b"\0" * 16))


def test_local_addresses_has_loopback() -> None:
    assert "127.0.0.1" in {str(a) for a in local_addresses()}

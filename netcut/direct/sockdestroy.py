"""Destroy TCP flows that a cut leaves without a way out. Runs *inside* the namespace.

A connection opened during setup must not outlive the cut. Once its route is gone the kernel
cannot even send it a reset through netfilter (a packet with no route never reaches OUTPUT),
so the owner would sit in recv() until a TCP timeout. Instead, like `ss -K`, this asks the
kernel (sock_diag SOCK_DESTROY, CONFIG_INET_DIAG_DESTROY) to abort every such socket: its
owner sees ECONNABORTED at once. Bounded: one dump per family, one request per socket.

Cheap when there is nothing to destroy: a dump of connected sockets walks the kernel's
machine-wide connection table (~1.5 ms of CPU per family on a busy host, whatever the
namespace holds), while its /proc/net/sockstat counts this namespace's TCP sockets and a dump
of listeners only walks the small listening table. A family whose every socket is a listener
(a sandbox with the proxy's listener and no connection yet: every prepare) is not dumped.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct

from netcut.direct.kernelstate import PROC_NET

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
SOCK_DESTROY = 21
NLM_F_REQUEST, NLM_F_ACK, NLM_F_DUMP = 0x1, 0x4, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
_HDR = struct.Struct("=IHHII")
_REQ = struct.Struct("=BBBxI")  # inet_diag_req_v2 without its sockid
_MSG_HEAD = struct.Struct("=BBBB")  # inet_diag_msg: family, state, timer, retrans
_SOCKID_LEN = 48
# Every TCP state but LISTEN (10) and CLOSE (7): connected or connecting sockets.
_STATES = sum(1 << s for s in (1, 2, 3, 4, 5, 6, 8, 9, 11))
_LISTEN = 1 << 10


def _allowed(peer: str, port: int, allowed: tuple[tuple[str, int | None], ...]) -> bool:
    addr = ipaddress.ip_address(peer)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped:
        addr = addr.ipv4_mapped
    if addr.is_loopback:
        return True
    return any(a == str(addr) and p in (None, port) for a, p in allowed)


def tcp_sockets_in_use() -> dict[int, int]:
    """TCP sockets of this process's namespace per family (any state but TIME_WAIT:
    listeners and connections), from its /proc/net/sockstat{,6}: per-namespace counters,
    far cheaper than a sock_diag dump. Read as bytes (Python's text layer doubled the cost
    of these small /proc reads, as of the sysctls': docs/netcut.md#many-sandboxes-at-once)."""
    found: dict[int, int] = {}
    for family, name, label in (
        (socket.AF_INET, "sockstat", b"TCP:"),
        (socket.AF_INET6, "sockstat6", b"TCP6:"),
    ):
        try:
            fd = os.open(f"{PROC_NET}/{name}", os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:  # no IPv6 in this kernel
            continue
        try:
            text = os.read(fd, 4096)
        finally:
            os.close(fd)
        for line in text.splitlines():
            fields = line.split()
            if fields[:2] == [label, b"inuse"]:
                found[family] = int(fields[2])
    return found


def kill_flows(allowed: tuple[tuple[str, int | None], ...]) -> int:
    """Abort every TCP socket in this namespace whose peer is not loopback or allowed;
    return how many were destroyed."""
    in_use = {family: n for family, n in tcp_sockets_in_use().items() if n > 0}
    if not in_use:
        return 0
    killed = 0
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG) as nl:
        for family, count in in_use.items():
            if count <= len(_dump(nl, family, _LISTEN)):
                continue  # every one is a listener: nothing connected to destroy
            for sockid, peer, port in _dump(nl, family, _STATES):
                if not _allowed(peer, port, allowed):
                    killed += _destroy(nl, family, sockid)
    return killed


def _request(
    nl: socket.socket, msg_type: int, flags: int, family: int, sockid: bytes, states: int
) -> None:
    body = _REQ.pack(family, socket.IPPROTO_TCP, 0, states) + sockid
    nl.send(_HDR.pack(_HDR.size + len(body), msg_type, flags, 1, 0) + body)


def _dump(nl: socket.socket, family: int, states: int) -> list[tuple[bytes, str, int]]:
    flags = NLM_F_REQUEST | NLM_F_DUMP
    _request(nl, SOCK_DIAG_BY_FAMILY, flags, family, bytes(_SOCKID_LEN), states)
    found: list[tuple[bytes, str, int]] = []
    while True:
        data = nl.recv(65536)
        offset = 0
        while offset < len(data):
            length, msg_type, _, _, _ = _HDR.unpack_from(data, offset)
            if length < _HDR.size or offset + length > len(data):
                raise OSError(f"sock_diag dump: a message of length {length} does not fit")
            if msg_type == NLMSG_DONE:
                return found
            if msg_type == NLMSG_ERROR:
                (code,) = struct.unpack_from("=i", data, offset + _HDR.size)
                raise OSError(-code, f"sock_diag dump: {os.strerror(-code)}")
            start = offset + _HDR.size + _MSG_HEAD.size
            found.append(_parse_sockid(data[start : start + _SOCKID_LEN], family))
            offset += (length + 3) & ~3


def _parse_sockid(sockid: bytes, family: int) -> tuple[bytes, str, int]:
    (dport,) = struct.unpack_from("!H", sockid, 2)
    raw = sockid[20:36] if family == socket.AF_INET6 else sockid[20:24]
    return sockid, socket.inet_ntop(family, raw), dport


def _destroy(nl: socket.socket, family: int, sockid: bytes) -> int:
    _request(nl, SOCK_DESTROY, NLM_F_REQUEST | NLM_F_ACK, family, sockid, _STATES)
    data = nl.recv(65536)
    _, msg_type, _, _, _ = _HDR.unpack_from(data, 0)
    if msg_type != NLMSG_ERROR:
        return 0
    (code,) = struct.unpack_from("=i", data, _HDR.size)
    if code == 0:
        return 1
    if -code == 2:  # ENOENT: it closed on its own meanwhile
        return 0
    raise OSError(-code, f"sock_diag destroy: {os.strerror(-code)}")

"""A thin synchronous rtnetlink client: netcut's own codec (direct/rtcodec.py) over a plain
socket.

Why not `pyroute2.IPRoute`: since 0.9 its synchronous API drives an asyncio loop per request,
which costs ~0.5 ms a call (half a cut's budget over a dozen calls) and cannot run under a
caller's running loop. Why not pyroute2's message classes either (netcut used them over this
socket until issue 23): decoding every attribute of a dump generically was a third of a
worker's CPU per prepare (rtcodec.py says more). Each request is encoded by rtcodec, sent on
an AF_NETLINK socket opened in the current namespace (the worker's, after setns), and the
answer parsed by rtcodec; the kernel's refusals raise `NetlinkError` (errno in `.code`). One
request at a time, so a sequence number is the whole bookkeeping. Bounded: a dump of a
namespace's routes and addresses is a few KiB; a 64 KiB receive buffer takes a netlink dump
page. A dump the kernel flags inconsistent (NLM_F_DUMP_INTR: the table changed under it) is
read again, a few times at most, rather than trusted.
"""

from __future__ import annotations

import socket

from netcut.direct import rtcodec
from netcut.direct.rtcodec import (
    NLM_F_ACK,
    NLM_F_CREATE,
    NLM_F_DUMP,
    NLM_F_EXCL,
    NLM_F_REQUEST,
    RTM_DELADDR,
    RTM_DELROUTE,
    RTM_GETADDR,
    RTM_GETROUTE,
    RTM_GETRULE,
    RTM_NEWADDR,
    RTM_NEWROUTE,
    MalformedMessage,
    Message,
    NetlinkError,
)
from netcut.plan.model import Addr, Route

_RECV = 65536
_DUMP_TRIES = 5


class Rtnl:
    """rtnetlink of the namespace this thread is in when the object is created."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        self.sock.bind((0, 0))
        self.seq = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Rtnl:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, msg_type: int, flags: int, body: bytes) -> list[Message]:
        for _ in range(_DUMP_TRIES):
            self.seq += 1
            self.sock.send(rtcodec.request(msg_type, flags, self.seq, body))
            answers: list[Message] = []
            interrupted = False
            while True:
                reply = rtcodec.parse(self.sock.recv(_RECV), self.seq)
                answers += reply.messages
                interrupted = interrupted or reply.interrupted
                if reply.done or (answers and not flags & (NLM_F_DUMP | NLM_F_ACK)):
                    break
            if not interrupted:
                return answers
        raise MalformedMessage(f"the kernel's dump kept changing under {_DUMP_TRIES} reads")

    def _dump(self, msg_type: int) -> list[Message]:
        return self._request(msg_type, NLM_F_REQUEST | NLM_F_DUMP, rtcodec.dump_body(msg_type))

    def dump_routes(self) -> list[Message]:
        return self._dump(RTM_GETROUTE)

    def dump_addrs(self) -> list[Message]:
        return self._dump(RTM_GETADDR)

    def dump_rules(self) -> list[Message]:
        """Policy routing rules (`ip rule`), IPv4 and IPv6."""
        return self._dump(RTM_GETRULE)

    def route_get(self, dst: str) -> Message:
        """The kernel's route lookup for `dst` (`ip route get`); NetlinkError if none."""
        found = self._request(RTM_GETROUTE, NLM_F_REQUEST, rtcodec.route_get_body(dst))
        if len(found) != 1:
            raise MalformedMessage(f"{len(found)} answers to one route lookup")
        return found[0]

    def route(self, add: bool, route: Route) -> None:
        body = route_body(route)
        if add:
            self._request(RTM_NEWROUTE, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, body)
        else:
            self._request(RTM_DELROUTE, NLM_F_REQUEST | NLM_F_ACK, body)

    def addr(self, add: bool, addr: Addr) -> None:
        body = rtcodec.addr_body(
            addr.family, addr.prefixlen, addr.flags, addr.scope, addr.index, addr.address
        )
        if add:
            self._request(RTM_NEWADDR, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, body)
        else:
            self._request(RTM_DELADDR, NLM_F_REQUEST | NLM_F_ACK, body)


def route_body(route: Route) -> bytes:
    """The body of the RTM_NEWROUTE/RTM_DELROUTE that adds or deletes `route`: a restore puts
    back exactly the route a cut took out (tests/netcut/test_rtcodec_kernel.py decodes it
    with pyroute2)."""
    optional = {
        "RTA_DST": route.dst,
        "RTA_GATEWAY": route.gateway,
        "RTA_OIF": route.oif,
        "RTA_PREFSRC": route.prefsrc,
        "RTA_PRIORITY": route.priority,
        "RTA_PREF": route.pref,
    }
    return rtcodec.route_body(
        route.family,
        route.dst_len,
        tos=route.tos,
        proto=route.proto,
        scope=route.scope,
        rtype=route.type,
        flags=route.flags,
        table=route.table,
        optional=optional,
        metrics=route.metrics,
    )


__all__ = ["MalformedMessage", "Message", "NetlinkError", "Rtnl", "route_body"]

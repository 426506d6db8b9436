"""A thin synchronous rtnetlink client: pyroute2's message classes over a plain socket.

Why not `pyroute2.IPRoute`: since 0.9 its synchronous API drives an asyncio loop per request,
which costs ~0.5 ms a call (half a cut's budget over a dozen calls) and cannot run under a
caller's running loop. Here each request is encoded by pyroute2's `rtmsg`/`ifaddrmsg`, sent
on an AF_NETLINK socket opened in the current namespace (the worker's, after setns), and the
answer parsed by pyroute2's `MarshalRtnl`; errors are pyroute2's `NetlinkError`. One request
at a time, so a sequence number is the whole bookkeeping. Bounded: a dump of a namespace's
routes and addresses is a few KiB; a 64 KiB receive buffer takes a netlink dump page.
"""

from __future__ import annotations

import socket
from typing import Any

from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl import (
    RTM_DELADDR,
    RTM_DELROUTE,
    RTM_GETADDR,
    RTM_GETROUTE,
    RTM_GETRULE,
    RTM_NEWADDR,
    RTM_NEWROUTE,
)
from pyroute2.netlink.rtnl.fibmsg import fibmsg
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
from pyroute2.netlink.rtnl.marshal import MarshalRtnl
from pyroute2.netlink.rtnl.rtmsg import rtmsg

from netcut.plan.model import AF_INET6, Addr, Route

NLMSG_ERROR, NLMSG_DONE = 2, 3
_RECV = 65536


class Rtnl:
    """rtnetlink of the namespace this thread is in when the object is created."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        self.sock.bind((0, 0))
        self.marshal = MarshalRtnl()
        self.seq = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Rtnl:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, msg: Any, msg_type: int, flags: int) -> list[Any]:
        self.seq += 1
        msg["header"]["type"] = msg_type
        msg["header"]["flags"] = flags
        msg["header"]["sequence_number"] = self.seq
        msg.encode()
        self.sock.send(msg.data)
        answers: list[Any] = []
        while True:
            for reply in self.marshal.parse(self.sock.recv(_RECV)):
                header = reply["header"]
                if header["sequence_number"] != self.seq:
                    continue  # a late answer to an earlier request
                if header.get("error") is not None:
                    raise header["error"]
                if header["type"] == NLMSG_DONE or (header["type"] == NLMSG_ERROR):
                    return answers  # NLMSG_ERROR with code 0 is the ACK
                answers.append(reply)
                if not flags & NLM_F_DUMP and not flags & NLM_F_ACK:
                    return answers

    def dump_routes(self) -> list[Any]:
        msg = rtmsg()
        msg["family"] = 0
        return self._request(msg, RTM_GETROUTE, NLM_F_REQUEST | NLM_F_DUMP)

    def dump_addrs(self) -> list[Any]:
        msg = ifaddrmsg()
        msg["family"] = 0
        return self._request(msg, RTM_GETADDR, NLM_F_REQUEST | NLM_F_DUMP)

    def dump_rules(self) -> list[Any]:
        """Policy routing rules (`ip rule`), IPv4 and IPv6."""
        msg = fibmsg()
        msg["family"] = 0
        return self._request(msg, RTM_GETRULE, NLM_F_REQUEST | NLM_F_DUMP)

    def route_get(self, dst: str) -> Any:
        """The kernel's route lookup for `dst` (`ip route get`); NetlinkError if none."""
        msg = rtmsg()
        msg["family"] = AF_INET6 if ":" in dst else socket.AF_INET
        msg["dst_len"] = 128 if ":" in dst else 32
        msg["attrs"] = [("RTA_DST", dst)]
        (answer,) = self._request(msg, RTM_GETROUTE, NLM_F_REQUEST)
        return answer

    def route(self, add: bool, route: Route) -> None:
        msg = rtmsg()
        for key in ("family", "dst_len", "tos", "proto", "scope", "type", "flags"):
            msg[key] = getattr(route, key)
        msg["table"] = route.table if route.table < 256 else 252  # RT_TABLE_COMPAT
        attrs: list[tuple[str, Any]] = [("RTA_TABLE", route.table)]
        optional = {
            "RTA_DST": route.dst,
            "RTA_GATEWAY": route.gateway,
            "RTA_OIF": route.oif,
            "RTA_PREFSRC": route.prefsrc,
            "RTA_PRIORITY": route.priority,
            "RTA_PREF": route.pref,
        }
        attrs += [(name, value) for name, value in optional.items() if value is not None]
        if route.metrics:
            attrs.append(("RTA_METRICS", {"attrs": [list(m) for m in route.metrics]}))
        msg["attrs"] = attrs
        if add:
            self._request(msg, RTM_NEWROUTE, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL)
        else:
            self._request(msg, RTM_DELROUTE, NLM_F_REQUEST | NLM_F_ACK)

    def addr(self, add: bool, addr: Addr) -> None:
        msg = ifaddrmsg()
        msg["family"] = addr.family
        msg["prefixlen"] = addr.prefixlen
        msg["index"] = addr.index
        msg["flags"] = addr.flags & 0xFF
        msg["scope"] = addr.scope
        msg["attrs"] = [
            ("IFA_LOCAL", addr.address),
            ("IFA_ADDRESS", addr.address),
            ("IFA_FLAGS", addr.flags),
        ]
        if add:
            self._request(msg, RTM_NEWADDR, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL)
        else:
            self._request(msg, RTM_DELADDR, NLM_F_REQUEST | NLM_F_ACK)


__all__ = ["NetlinkError", "Rtnl"]

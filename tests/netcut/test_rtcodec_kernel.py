"""netcut's rtnetlink codec (netcut/direct/rtcodec.py) against pyroute2's decoding, on what a
real kernel answers: a namespace given every kind of route, address and policy rule a cut
reads (tables, types, metrics, multipath, IPv6 preference, rule selectors), dumped once, and
the same bytes decoded by both. Every attribute rtcodec reads must come out exactly as
pyroute2 decodes it, and kernelstate's Route/Addr/PolicyRule built from either must be equal,
so records written with pyroute2's decoding still compare equal (docs/netcut.md#latency)."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from typing import Any

import pytest
from pyroute2.netlink.rtnl.marshal import MarshalRtnl

from netcut.direct import kernelstate, rtcodec
from netcut.direct.rtnl import route_body
from netcut.direct.worker import setns
from tests.netcut.netcut_testlib import sh

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")

_ROUTE_ATTRS = [name for name, _ in rtcodec._ROUTE_ATTRS.values()]
_ADDR_ATTRS = [name for name, _ in rtcodec._ADDR_ATTRS.values()]
_RULE_ATTRS = [name for name, _ in rtcodec._RULE_ATTRS.values()]
_FIELDS = {
    rtcodec.RTM_NEWROUTE: rtcodec._RTMSG_FIELDS,
    rtcodec.RTM_NEWADDR: rtcodec._IFADDRMSG_FIELDS,
    rtcodec.RTM_NEWRULE: rtcodec._FIBMSG_FIELDS,
}


def _rich_namespace(make_netns: Callable[[str], str]) -> str:
    """Every kind of state a cut reads, in 198.18.0.0/15 (IPv6: its NAT64 form and link-local
    addresses); nothing here sends a packet."""
    ns = make_netns("rc")
    ip: Callable[..., Any] = lambda *a: sh("ip", "-n", ns, *a)  # noqa: E731
    ip("link", "add", "eth0", "type", "veth", "peer", "name", "eth1")
    ip("link", "set", "eth0", "up")
    ip("link", "set", "eth1", "up")
    ip("addr", "add", "198.18.5.2/24", "dev", "eth0")
    ip("addr", "add", "198.18.6.2/24", "dev", "eth1", "noprefixroute")
    ip("-6", "addr", "add", "64:ff9b::c612:501/120", "dev", "eth0", "nodad")
    ip("route", "add", "default", "via", "198.18.5.1")
    ip("route", "add", "198.18.9.0/24", "dev", "eth0", "mtu", "1400", "advmss", "1300",
       "initcwnd", "10", "table", "100")  # fmt: skip
    ip("route", "add", "198.18.10.0/24", "nexthop", "dev", "eth0", "nexthop", "dev", "eth1")
    ip("route", "add", "blackhole", "198.18.11.0/24")
    ip("route", "add", "unreachable", "198.18.12.0/24", "table", "300")
    ip("route", "add", "prohibit", "198.18.13.0/24")
    ip("route", "add", "198.18.14.0/24", "via", "198.18.5.9", "dev", "eth0", "onlink", "src",
       "198.18.5.2", "tos", "0x10", "metric", "5", "proto", "static")  # fmt: skip
    ip("route", "add", "broadcast", "198.18.15.255", "dev", "eth0", "table", "main")
    ip("-6", "route", "add", "64:ff9b::c612:600/120", "dev", "eth0", "pref", "high",
       "metric", "77")  # fmt: skip
    ip("-6", "route", "add", "::ffff:198.18.0.0/120", "dev", "eth0")
    ip("-6", "route", "add", "default", "via", "fe80::1", "dev", "eth0", "table", "70000")
    ip("rule", "add", "from", "198.18.3.0/24", "to", "198.18.4.0/24", "iif", "eth0", "oif",
       "eth1", "fwmark", "7", "priority", "100", "table", "100")  # fmt: skip
    ip("rule", "add", "priority", "150", "table", "70000")
    ip("-6", "rule", "add", "from", "64:ff9b::c612:0/120", "table", "101", "priority", "200")
    return ns


def _raw_dump(ns: str, msg_type: int) -> bytes:
    """The kernel's answer to a dump in `ns`, as bytes, every receive buffer of it."""
    box: dict[str, Any] = {}

    def run() -> None:
        fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
        try:
            setns(fd)  # this thread only; it ends right after
        finally:
            os.close(fd)
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        sock.bind((0, 0))
        flags = rtcodec.NLM_F_REQUEST | rtcodec.NLM_F_DUMP
        sock.send(rtcodec.request(msg_type, flags, 1, rtcodec.dump_body(msg_type)))
        chunks = []
        while True:
            data = sock.recv(65536)
            chunks.append(data)
            if rtcodec.parse(data, 1).done:
                break
        sock.close()
        box["data"] = chunks

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return b"".join(box["data"])


def _pyroute2(data: bytes) -> list[Any]:
    return [m for m in MarshalRtnl().parse(data) if m["header"]["type"] in _FIELDS]


def _compare(data: bytes, attrs: list[str]) -> tuple[list[Any], list[rtcodec.Message]]:
    theirs = _pyroute2(data)
    ours = rtcodec.parse(data, 1).messages
    assert len(ours) == len(theirs) > 0
    for mine, other in zip(ours, theirs, strict=True):
        assert mine.type == other["header"]["type"]
        for field in _FIELDS[mine.type]:
            assert mine[field] == other[field], (field, mine, other)
        if mine.type == rtcodec.RTM_NEWROUTE and mine["family"] not in (2, 10):
            continue
        for name in attrs:
            want = other.get_attr(name)
            if name == "RTA_MULTIPATH":  # read for its presence only
                assert (mine.get_attr(name) is None) == (want is None), (name, other)
            elif name == "RTA_METRICS" and want is not None:  # pyroute2's is an nla object
                assert mine.get_attr(name)["attrs"] == [(n, v) for n, v in want["attrs"]], other
            else:
                assert mine.get_attr(name) == want, (name, mine, other)
    return theirs, ours


def test_routes_decode_as_pyroute2_does(make_netns: Callable[[str], str]) -> None:
    ns = _rich_namespace(make_netns)
    theirs, ours = _compare(_raw_dump(ns, rtcodec.RTM_GETROUTE), _ROUTE_ATTRS)
    names = {1: "lo", 2: "eth0", 3: "eth1"}
    seen = {m.get_attr("RTA_DST") for m in ours}
    assert {"198.18.9.0", "::ffff:198.18.0.0", "64:ff9b::c612:600"} <= seen
    assert any(m.get_attr("RTA_METRICS") for m in ours)
    assert any(m.get_attr("RTA_MULTIPATH") is not None for m in ours)
    assert any(m.get_attr("RTA_TABLE") == 70000 for m in ours)
    for mine, other in zip(ours, theirs, strict=True):
        if mine["family"] in (2, 10):
            assert kernelstate._route(mine, names, strict=False) == kernelstate._route(
                other, names, strict=False
            )


def test_addrs_decode_as_pyroute2_does(make_netns: Callable[[str], str]) -> None:
    ns = _rich_namespace(make_netns)
    theirs, ours = _compare(_raw_dump(ns, rtcodec.RTM_GETADDR), _ADDR_ATTRS)
    names = {1: "lo", 2: "eth0", 3: "eth1"}
    assert {"64:ff9b::c612:501", "198.18.6.2"} <= {m.get_attr("IFA_ADDRESS") for m in ours}
    for mine, other in zip(ours, theirs, strict=True):
        assert kernelstate._addr(mine, names) == kernelstate._addr(other, names)


def test_rules_decode_as_pyroute2_does(make_netns: Callable[[str], str]) -> None:
    ns = _rich_namespace(make_netns)
    theirs, ours = _compare(_raw_dump(ns, rtcodec.RTM_GETRULE), _RULE_ATTRS)
    assert any(m.get_attr("FRA_OIFNAME") == "eth1" for m in ours)
    assert any(m.get_attr("FRA_TABLE") == 70000 for m in ours)
    for mine, other in zip(ours, theirs, strict=True):
        assert kernelstate._rule(mine) == kernelstate._rule(other)


def test_requests_encode_as_pyroute2_does() -> None:
    """The route a cut deletes and puts back, encoded as `Rtnl.route` sends it, decodes (by
    pyroute2) to the route it came from: a restore puts back exactly what was there."""
    from netcut.plan.model import Route

    route = Route(
        family=2, dst="198.18.14.0", dst_len=24, oif=2, ifname="eth0", table=70000,
        gateway="198.18.5.9", proto=4, scope=0, prefsrc="198.18.5.2", priority=5, tos=16,
        flags=4, metrics=(("RTAX_MTU", 1400), ("RTAX_ADVMSS", 1300)),
    )  # fmt: skip
    data = rtcodec.request(rtcodec.RTM_NEWROUTE, 0, 1, route_body(route))
    (other,) = _pyroute2(data)
    assert kernelstate._route(other, {2: "eth0"}) == route
    (mine,) = rtcodec.parse(data, 1).messages
    assert kernelstate._route(mine, {2: "eth0"}) == route

"""rtnetlink messages to and from bytes: the requests netcut sends, and the few attributes it
reads back from route, address and policy-rule messages.

Why not pyroute2's marshal (which netcut used until issue 23): its generic classes decode every
attribute of every message into nested objects, then look each one up by name in a list. For
the state reads of one prepare and its release that was about a third of a netcut worker's
CPU (docs/netcut.md#latency). Here a message is its fixed header, unpacked by one `struct`,
and a dict of only the attributes netcut reads, decoded exactly as pyroute2 decodes them
(addresses by `inet_ntop`, names up to their NUL, the route metrics by pyroute2's names), so
a record written before still compares equal. Everything else in a message is skipped.

The kernel's answers are still input: every length is checked against the buffer before it
is used, a message or attribute that does not fit raises `MalformedMessage` (never a wrong
value, an IndexError or a loop without progress). tests/unit/test_rtcodec.py throws hostile
bytes at it; tests/netcut/test_rtcodec_kernel.py compares it with pyroute2 on real dumps.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable, Iterator
from typing import Any

# linux/netlink.h, linux/rtnetlink.h
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_ACK, NLM_F_EXCL, NLM_F_CREATE, NLM_F_DUMP = 0x1, 0x4, 0x200, 0x400, 0x300
NLM_F_DUMP_INTR = 0x10
RTM_NEWROUTE, RTM_DELROUTE, RTM_GETROUTE = 24, 25, 26
RTM_NEWADDR, RTM_DELADDR, RTM_GETADDR = 20, 21, 22
RTM_NEWRULE, RTM_GETRULE = 32, 34
AF_INET, AF_INET6 = socket.AF_INET, socket.AF_INET6
RT_TABLE_COMPAT = 252

NLMSGHDR = struct.Struct("=IHHII")  # length, type, flags, sequence number, port id
_RTMSG = struct.Struct("=BBBBBBBBI")
_IFADDRMSG = struct.Struct("=BBBBI")
_FIBMSG = struct.Struct("=BBBBBBBBI")
_NLA = struct.Struct("=HH")
_U32 = struct.Struct("=I")
_I32 = struct.Struct("=i")
NLA_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED and NLA_F_NET_BYTEORDER

_RTMSG_FIELDS = ("family", "dst_len", "src_len", "tos", "table", "proto", "scope", "type", "flags")
_IFADDRMSG_FIELDS = ("family", "prefixlen", "flags", "scope", "index")
_FIBMSG_FIELDS = ("family", "dst_len", "src_len", "tos", "table", "res1", "res2", "action", "flags")

# pyroute2's names for RTA_METRICS' members (rtmsg.metrics), so records keep their spelling.
METRICS = (
    "RTAX_UNSPEC",
    "RTAX_LOCK",
    "RTAX_MTU",
    "RTAX_WINDOW",
    "RTAX_RTT",
    "RTAX_RTTVAR",
    "RTAX_SSTHRESH",
    "RTAX_CWND",
    "RTAX_ADVMSS",
    "RTAX_REORDERING",
    "RTAX_HOPLIMIT",
    "RTAX_INITCWND",
    "RTAX_FEATURES",
    "RTAX_RTO_MIN",
    "RTAX_INITRWND",
    "RTAX_QUICKACK",
    "RTAX_CC_ALGO",
)
_METRIC_INDEX = {name: index for index, name in enumerate(METRICS)}
RTAX_CC_ALGO = 16


class MalformedMessage(ValueError):
    """A netlink message, or an attribute in it, does not fit where it is."""


class NetlinkError(OSError):
    """The kernel refused a request: `code` is the errno (pyroute2's NetlinkError's face)."""

    def __init__(self, code: int, message: str | None = None) -> None:
        super().__init__(code, message or _strerror(code))
        self.code = code


def _strerror(code: int) -> str:
    import os

    return os.strerror(code)


class Message:
    """One decoded message: its fixed header's fields by name (`msg["family"]`) and the
    attributes netcut reads (`msg.get_attr("RTA_DST")`, None when absent; the first of a
    repeated one, as pyroute2 answers)."""

    __slots__ = ("attrs", "fields", "type")

    def __init__(self, msg_type: int, fields: dict[str, int], attrs: dict[str, Any]) -> None:
        self.type = msg_type
        self.fields = fields
        self.attrs = attrs

    def __getitem__(self, key: str) -> int:
        return self.fields[key]

    def get_attr(self, name: str) -> Any:
        return self.attrs.get(name)

    def __repr__(self) -> str:
        return f"Message({self.type}, {self.fields}, {self.attrs})"


# ---------------------------------------------------------------- attribute decoders


def _target(family: int, raw: bytes) -> str:
    """A route's address, of the message's family (pyroute2's `target`)."""
    if family == AF_INET and len(raw) == 4:
        return socket.inet_ntop(AF_INET, raw)
    if family == AF_INET6 and len(raw) == 16:
        return socket.inet_ntop(AF_INET6, raw)
    raise MalformedMessage(f"a {len(raw)}-byte address for family {family}")


def _ipaddr(family: int, raw: bytes) -> str:
    """An address or rule's address, of the family its length says (pyroute2's `ipaddr`)."""
    if len(raw) == 4:
        return socket.inet_ntop(AF_INET, raw)
    if len(raw) == 16:
        return socket.inet_ntop(AF_INET6, raw)
    raise MalformedMessage(f"a {len(raw)}-byte address")


def _u32(family: int, raw: bytes) -> int:
    if len(raw) != 4:
        raise MalformedMessage(f"a {len(raw)}-byte value where 4 belong")
    return int(_U32.unpack(raw)[0])


def _u8(family: int, raw: bytes) -> int:
    if len(raw) != 1:
        raise MalformedMessage(f"a {len(raw)}-byte value where 1 belongs")
    return raw[0]


def _name(family: int, raw: bytes) -> str:
    """A NUL-terminated name (an interface's: ASCII in practice), up to its first NUL."""
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def _present(family: int, raw: bytes) -> bytes:
    return raw


def _metrics(family: int, raw: bytes) -> dict[str, list[tuple[str, Any]]]:
    """RTA_METRICS, nested: [(name, value), ...] in wire order under "attrs", as pyroute2."""
    found: list[tuple[str, Any]] = []
    for kind, value in attributes(raw, 0, len(raw)):
        name = METRICS[kind] if kind < len(METRICS) else f"RTAX_{kind}"
        found.append((name, _name(family, value) if kind == RTAX_CC_ALGO else _u32(family, value)))
    return {"attrs": found}


_Decoder = Callable[[int, bytes], Any]
_ROUTE_ATTRS: dict[int, tuple[str, _Decoder]] = {
    1: ("RTA_DST", _target),
    4: ("RTA_OIF", _u32),
    5: ("RTA_GATEWAY", _target),
    6: ("RTA_PRIORITY", _u32),
    7: ("RTA_PREFSRC", _target),
    8: ("RTA_METRICS", _metrics),
    9: ("RTA_MULTIPATH", _present),
    15: ("RTA_TABLE", _u32),
    20: ("RTA_PREF", _u8),
}
_ADDR_ATTRS: dict[int, tuple[str, _Decoder]] = {
    1: ("IFA_ADDRESS", _ipaddr),
    2: ("IFA_LOCAL", _ipaddr),
    8: ("IFA_FLAGS", _u32),
}
_RULE_ATTRS: dict[int, tuple[str, _Decoder]] = {
    1: ("FRA_DST", _ipaddr),
    2: ("FRA_SRC", _ipaddr),
    3: ("FRA_IIFNAME", _name),
    6: ("FRA_PRIORITY", _u32),
    10: ("FRA_FWMARK", _u32),
    15: ("FRA_TABLE", _u32),
    17: ("FRA_OIFNAME", _name),
}
# message type -> its fixed header, that header's field names, the attributes read
_KINDS: dict[int, tuple[struct.Struct, tuple[str, ...], dict[int, tuple[str, _Decoder]]]] = {
    RTM_NEWROUTE: (_RTMSG, _RTMSG_FIELDS, _ROUTE_ATTRS),
    RTM_NEWADDR: (_IFADDRMSG, _IFADDRMSG_FIELDS, _ADDR_ATTRS),
    RTM_NEWRULE: (_FIBMSG, _FIBMSG_FIELDS, _RULE_ATTRS),
}


def attributes(data: bytes, start: int, end: int) -> Iterator[tuple[int, bytes]]:
    """(type, payload) of each netlink attribute in data[start:end]; every step moves on by
    at least one attribute header, so this ends on any input."""
    pos = start
    while pos < end:
        if pos + _NLA.size > end:
            raise MalformedMessage("an attribute header runs past its message")
        length, kind = _NLA.unpack_from(data, pos)
        if length < _NLA.size or pos + length > end:
            raise MalformedMessage(f"an attribute of length {length} does not fit")
        yield kind & NLA_TYPE_MASK, data[pos + _NLA.size : pos + length]
        pos += (length + 3) & ~3


def decode_body(msg_type: int, data: bytes, start: int, end: int) -> Message | None:
    """The message of `msg_type` whose body is data[start:end]; None for a type netcut does
    not read."""
    kind = _KINDS.get(msg_type)
    if kind is None:
        return None
    header, names, wanted = kind
    if end - start < header.size:
        raise MalformedMessage(f"a {end - start}-byte body for message type {msg_type}")
    fields = dict(zip(names, header.unpack_from(data, start), strict=True))
    family = fields["family"]
    attrs: dict[str, Any] = {}
    if msg_type == RTM_NEWROUTE and family not in (AF_INET, AF_INET6):
        return Message(msg_type, fields, attrs)  # multicast (ipmr) or MPLS: netcut reads none
    for number, value in attributes(data, start + ((header.size + 3) & ~3), end):
        entry = wanted.get(number)
        if entry is not None and entry[0] not in attrs:
            attrs[entry[0]] = entry[1](family, value)
    return Message(msg_type, fields, attrs)


class Reply:
    """What one receive buffer held for request `seq`: its messages, whether the answer is
    complete (DONE, or the ACK), and whether the kernel flagged the dump inconsistent."""

    __slots__ = ("done", "interrupted", "messages")

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.done = False
        self.interrupted = False


def parse(data: bytes, seq: int) -> Reply:
    """Parse a receive buffer. Messages of another sequence number (late answers to earlier
    requests) are skipped; an NLMSG_ERROR with a non-zero code raises NetlinkError."""
    reply = Reply()
    offset = 0
    while offset < len(data):
        if offset + NLMSGHDR.size > len(data):
            raise MalformedMessage("a message header runs past the buffer")
        length, msg_type, flags, msg_seq, _ = NLMSGHDR.unpack_from(data, offset)
        if length < NLMSGHDR.size or offset + length > len(data):
            raise MalformedMessage(f"a message of length {length} does not fit")
        body, end = offset + NLMSGHDR.size, offset + length
        offset += (length + 3) & ~3
        if msg_seq != seq:
            continue
        if flags & NLM_F_DUMP_INTR:
            reply.interrupted = True
        if msg_type == NLMSG_DONE:
            reply.done = True
        elif msg_type == NLMSG_ERROR:
            if end - body < _I32.size:
                raise MalformedMessage("an error message without its code")
            (code,) = _I32.unpack_from(data, body)
            if code:
                raise NetlinkError(-code)
            reply.done = True  # the ACK
        else:
            found = decode_body(msg_type, data, body, end)
            if found is not None:
                reply.messages.append(found)
    return reply


# ---------------------------------------------------------------- requests


def _nla(kind: int, payload: bytes) -> bytes:
    length = _NLA.size + len(payload)
    return _NLA.pack(length, kind) + payload + bytes(-length % 4)


def _pton(family: int, text: str) -> bytes:
    return socket.inet_pton(family, text)


def request(msg_type: int, flags: int, seq: int, body: bytes) -> bytes:
    return NLMSGHDR.pack(NLMSGHDR.size + len(body), msg_type, flags, seq, 0) + body


def dump_body(msg_type: int) -> bytes:
    """The body of a dump of every family: rtmsg / ifaddrmsg / fib_rule_hdr, all zero."""
    return bytes((_IFADDRMSG if msg_type == RTM_GETADDR else _RTMSG).size)


def route_get_body(dst: str) -> bytes:
    family = AF_INET6 if ":" in dst else AF_INET
    head = _RTMSG.pack(family, 128 if family == AF_INET6 else 32, 0, 0, 0, 0, 0, 0, 0)
    return head + _nla(1, _pton(family, dst))


def route_body(
    family: int,
    dst_len: int,
    *,
    tos: int,
    proto: int,
    scope: int,
    rtype: int,
    flags: int,
    table: int,
    optional: dict[str, Any],
    metrics: tuple[tuple[str, Any], ...],
) -> bytes:
    """rtmsg and its attributes for adding or deleting a route; `optional` maps RTA_DST,
    RTA_GATEWAY, RTA_OIF, RTA_PREFSRC, RTA_PRIORITY, RTA_PREF to values (None: absent)."""
    compat = table if table < 256 else RT_TABLE_COMPAT
    head = _RTMSG.pack(family, dst_len, 0, tos, compat, proto, scope, rtype, flags)
    out = [head, _nla(15, _U32.pack(table))]
    for number, name, encode in _ROUTE_ENCODE:
        value = optional.get(name)
        if value is not None:
            out.append(_nla(number, encode(family, value)))
    if metrics:
        nested = b"".join(_metric(name, value) for name, value in metrics)
        out.append(_nla(8, nested))
    return b"".join(out)


def _metric(name: str, value: Any) -> bytes:
    index = _METRIC_INDEX.get(name)
    if index is None:
        if not name.startswith("RTAX_") or not name[5:].isdigit():
            raise ValueError(f"unknown route metric {name!r}")
        index = int(name[5:])
    if index == RTAX_CC_ALGO:
        return _nla(index, str(value).encode() + b"\0")
    return _nla(index, _U32.pack(int(value)))


_ROUTE_ENCODE: tuple[tuple[int, str, Callable[[int, Any], bytes]], ...] = (
    (1, "RTA_DST", _pton),
    (5, "RTA_GATEWAY", _pton),
    (4, "RTA_OIF", lambda _f, v: _U32.pack(v)),
    (7, "RTA_PREFSRC", _pton),
    (6, "RTA_PRIORITY", lambda _f, v: _U32.pack(v)),
    (20, "RTA_PREF", lambda _f, v: bytes((v,))),
)


def addr_body(
    family: int, prefixlen: int, flags: int, scope: int, index: int, address: str
) -> bytes:
    """ifaddrmsg with IFA_LOCAL, IFA_ADDRESS and IFA_FLAGS, for adding or deleting one."""
    raw = _pton(family, address)
    return (
        _IFADDRMSG.pack(family, prefixlen, flags & 0xFF, scope, index)
        + _nla(2, raw)
        + _nla(1, raw)
        + _nla(8, _U32.pack(flags))
    )

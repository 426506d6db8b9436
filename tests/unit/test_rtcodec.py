"""netcut's rtnetlink codec on hostile bytes: whatever a receive buffer holds, `parse` answers
with messages, or raises MalformedMessage (or NetlinkError for a well-formed refusal); never
another exception, a wrong-sized read or a loop. The differential test against pyroute2 on
real kernel dumps is tests/netcut/test_rtcodec_kernel.py."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netcut.direct import rtcodec
from netcut.direct.rtcodec import MalformedMessage, NetlinkError

_TYPES = (rtcodec.RTM_NEWROUTE, rtcodec.RTM_NEWADDR, rtcodec.RTM_NEWRULE)


def _nla(kind: int, payload: bytes) -> bytes:
    return struct.pack("=HH", 4 + len(payload), kind) + payload + bytes(-len(payload) % 4)


def _msg(msg_type: int, body: bytes, seq: int = 1, flags: int = 0) -> bytes:
    return rtcodec.request(msg_type, flags, seq, body) + bytes(-len(body) % 4)


def _parse_or_refuse(data: bytes, seq: int) -> rtcodec.Reply | None:
    try:
        return rtcodec.parse(data, seq)
    except (MalformedMessage, NetlinkError):
        return None


@given(st.binary(max_size=600), st.integers(0, 3))
def test_any_bytes_parse_or_are_refused(data: bytes, seq: int) -> None:
    _parse_or_refuse(data, seq)


_attr = st.tuples(st.integers(0, 0xFFFF), st.binary(max_size=24))
_header = st.sampled_from(_TYPES)


@st.composite
def _messages(draw: st.DrawFn) -> bytes:
    """Messages of the types netcut reads, with well-framed attributes of any type and
    content (wrong sizes for their type included), nested metrics too."""
    out = []
    for _ in range(draw(st.integers(1, 4))):
        msg_type = draw(_header)
        head = bytes([draw(st.sampled_from([0, 2, 10, 28, 128]))]) + draw(
            st.binary(min_size=11, max_size=11)
        )
        attrs = [_nla(k, v) for k, v in draw(st.lists(_attr, max_size=6))]
        if draw(st.booleans()):
            inner = b"".join(_nla(k, v) for k, v in draw(st.lists(_attr, max_size=4)))
            attrs.append(_nla(8, inner))
        out.append(_msg(msg_type, head + b"".join(attrs)))
    if draw(st.booleans()):
        out.append(_msg(rtcodec.NLMSG_DONE, b"\0\0\0\0"))
    return b"".join(out)


@settings(max_examples=300)
@given(_messages(), st.data())
def test_framed_messages_with_hostile_attributes(data: bytes, extra: st.DataObject) -> None:
    reply = _parse_or_refuse(data, 1)
    if reply is not None:
        for msg in reply.messages:
            assert msg.type in _TYPES
            for value in msg.attrs.values():
                assert isinstance(value, int | str | bytes | dict)
    # every truncation and every single-byte change is parsed or refused too
    cut = extra.draw(st.integers(0, len(data)))
    _parse_or_refuse(data[:cut], 1)
    spot = extra.draw(st.integers(0, max(0, len(data) - 1)))
    if data:
        changed = bytearray(data)
        changed[spot] = extra.draw(st.integers(0, 255))
        _parse_or_refuse(bytes(changed), 1)


def test_a_zero_length_attribute_is_refused_not_looped() -> None:
    body = bytes([2]) + bytes(11) + struct.pack("=HH", 0, 1) + bytes(8)
    with pytest.raises(MalformedMessage):
        rtcodec.parse(_msg(rtcodec.RTM_NEWROUTE, body), 1)


def test_a_zero_length_message_is_refused_not_looped() -> None:
    with pytest.raises(MalformedMessage):
        rtcodec.parse(struct.pack("=IHHII", 0, rtcodec.RTM_NEWROUTE, 0, 1, 0) + bytes(12), 1)


def test_an_attribute_past_its_message_is_refused() -> None:
    body = bytes([2]) + bytes(11) + struct.pack("=HH", 40, 1) + bytes(4)
    with pytest.raises(MalformedMessage):
        rtcodec.parse(_msg(rtcodec.RTM_NEWROUTE, body), 1)


def test_an_address_of_the_wrong_size_is_refused() -> None:
    body = bytes([2]) + bytes(11) + _nla(1, bytes(16))  # IPv4 route, 16-byte RTA_DST
    with pytest.raises(MalformedMessage):
        rtcodec.parse(_msg(rtcodec.RTM_NEWROUTE, body), 1)


def test_refusal_and_ack() -> None:
    refused = _msg(rtcodec.NLMSG_ERROR, struct.pack("=i", -17) + bytes(16))
    with pytest.raises(NetlinkError) as err:
        rtcodec.parse(refused, 1)
    assert err.value.code == 17
    assert rtcodec.parse(_msg(rtcodec.NLMSG_ERROR, bytes(20)), 1).done
    with pytest.raises(MalformedMessage):
        rtcodec.parse(_msg(rtcodec.NLMSG_ERROR, b"\0\0"), 1)


def test_other_sequence_numbers_and_interrupted_dumps() -> None:
    route = bytes([2, 24]) + bytes(10) + _nla(1, bytes([198, 18, 0, 0]))
    late = _msg(rtcodec.RTM_NEWROUTE, route, seq=7)
    assert rtcodec.parse(late, 1).messages == []
    flagged = _msg(rtcodec.RTM_NEWROUTE, route, flags=rtcodec.NLM_F_DUMP_INTR)
    reply = rtcodec.parse(flagged, 1)
    assert reply.interrupted
    assert reply.messages[0].get_attr("RTA_DST") == "198.18.0.0"


def test_first_of_a_repeated_attribute_wins() -> None:
    route = bytes([2, 24]) + bytes(10) + _nla(4, struct.pack("=I", 3)) + _nla(4, b"\x09\0\0\0")
    (msg,) = rtcodec.parse(_msg(rtcodec.RTM_NEWROUTE, route), 1).messages
    assert msg.get_attr("RTA_OIF") == 3


@given(
    st.lists(
        st.tuples(st.sampled_from(rtcodec.METRICS[1:16]), st.integers(0, 2**32 - 1)), max_size=5
    )
)
def test_metrics_round_trip(metrics: list[tuple[str, int]]) -> None:
    body = rtcodec.route_body(
        2,
        24,
        tos=0,
        proto=4,
        scope=0,
        rtype=1,
        flags=0,
        table=254,
        optional={"RTA_DST": "198.18.1.0"},
        metrics=tuple(metrics),
    )
    (msg,) = rtcodec.parse(_msg(rtcodec.RTM_NEWROUTE, body), 1).messages
    assert msg.get_attr("RTA_DST") == "198.18.1.0"
    assert msg.get_attr("RTA_TABLE") == 254
    assert (msg.get_attr("RTA_METRICS") or {"attrs": []})["attrs"] == metrics

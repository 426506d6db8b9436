"""The DNS mode as playbooks: a query's bytes in, its `Intent`, the exchange's actions, the
answer's bytes and the record out. No sockets.

The responder (`modes/dns.py`) only reads datagrams and writes what `render`
gives it; everything decided and recorded is here, through the same `Exchange` as every other
mode (docs/architecture.md#one-exchange), and the records are the ones docs/audit-log.md#dns-records
describes, field for field and in that order.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

import dns.flags
import dns.message
import dns.opcode
import dns.rcode
import dns.rdataclass
import pytest

from egress.config import Settings
from egress.policy.addrs import AddressGuard
from egress.policy.rules import Policy
from egress.proxy.codec.dns import FakeIPs, read_query
from egress.proxy.core.actions import Done, Refuse, Resolve
from egress.proxy.core.clients import ClientTable, Identity
from egress.proxy.core.exchange import Exchange, State
from egress.proxy.core.gate import Gate
from egress.proxy.core.record import RCODE_TEXT
from egress.proxy.modes.dns import play, query_intent, render
from egress.proxy.modes.kinds import DNS
from egress.reasons import Reason

POLICY = Policy(allow=["x.test", "*.ok.test:443"], block=["bad.x.test"])
CLIENT = "198.18.0.5:5353"


def gate_for(policy: Policy) -> Gate:
    return Gate(ClientTable(Settings(policy), require_auth=False), AddressGuard())


def query(name: str = "x.test", qtype: str = "A") -> bytes:
    return dns.message.make_query(name, qtype).to_wire()


def notify() -> bytes:
    message = dns.message.make_query("x.test", "A")
    message.set_opcode(dns.opcode.NOTIFY)
    return message.to_wire()


def chaos() -> bytes:
    return dns.message.make_query("x.test", "TXT", rdclass=dns.rdataclass.CH).to_wire()


def response() -> bytes:
    return dns.message.make_response(dns.message.make_query("x.test", "A")).to_wire()


@dataclass(frozen=True)
class Answered:
    """What one query must end as: the rcode sent (None: dropped), and the record's fields."""

    rcode: int | None
    decision: str
    reason: Reason
    host: str = ""
    qtype: str = ""
    rule: str | None = None
    answer: str | None = None


def run(
    data: bytes,
    policy: Policy = POLICY,
    *,
    audit_ok: bool = True,
    pool: FakeIPs | None = None,
    transport: str = "udp",
) -> tuple[Refuse | Done, bytes | None, dict[str, object]]:
    q = read_query(data)
    identity = Identity("task-1", policy)
    intent = query_intent(q, CLIENT, identity, transport, audit_ok=audit_ok, t0=0)
    x = Exchange(gate_for(policy), DNS)
    action = play(x, intent, pool if pool is not None else FakeIPs())
    assert x.state is State.DONE
    done = action.done if isinstance(action, Refuse) else action
    event = done.record.event(done.decision, done.reason, done.rule, done.detail, done.status)
    return action, render(q, action), event


# (id, query bytes, policy, audit_ok, pool, expected)
FULL = FakeIPs("198.19.128.0/30")  # two host addresses, both given out: full from now on
FULL.address_for("one.test")
FULL.address_for("two.test")
MATRIX = [
    (
        "allowed A",
        query(),
        POLICY,
        True,
        None,
        Answered(0, "allow", Reason.ALLOW_RULE, "x.test", "A", "x.test", "198.19.128.1"),
    ),
    (
        "allowed AAAA: NODATA",
        query(qtype="AAAA"),
        POLICY,
        True,
        None,
        Answered(0, "allow", Reason.ALLOW_RULE, "x.test", "AAAA", "x.test"),
    ),
    (
        "any port of a name",
        query("a.ok.test"),
        POLICY,
        True,
        None,
        Answered(0, "allow", Reason.ALLOW_RULE, "a.ok.test", "A", "*.ok.test:443", "198.19.128.1"),
    ),
    (
        "block rule",
        query("bad.x.test"),
        POLICY,
        True,
        None,
        Answered(3, "block", Reason.BLOCK_RULE, "bad.x.test", "A", "bad.x.test"),
    ),
    (
        "default deny",
        query("y.test"),
        POLICY,
        True,
        None,
        Answered(3, "block", Reason.DEFAULT_DENY, "y.test", "A"),
    ),
    (
        "default allow",
        query("y.test"),
        Policy(default="allow"),
        True,
        None,
        Answered(0, "allow", Reason.DEFAULT_ALLOW, "y.test", "A", None, "198.19.128.1"),
    ),
    (
        "address rules, opted in",
        query("y.test"),
        Policy(allow=["198.18.0.0/15"], resolve_names_for_address_rules=True),
        True,
        None,
        Answered(0, "allow", Reason.ADDRESS_RULES, "y.test", "A", None, "198.19.128.1"),
    ),
    (
        "address rules admit addresses, not names",
        query("y.test"),
        Policy(allow=["198.18.0.0/15"]),
        True,
        None,
        Answered(3, "block", Reason.DEFAULT_DENY, "y.test", "A"),
    ),
    (
        "an address spelling",
        query("2130706433"),
        POLICY,
        True,
        None,
        Answered(3, "block", Reason.NOT_A_NAME, "127.0.0.1", "A"),
    ),
    (
        "pool full",
        query(),
        POLICY,
        True,
        FULL,
        Answered(2, "error", Reason.POOL_EXHAUSTED, "x.test", "A"),
    ),
    ("audit closed", query(), POLICY, False, None, Answered(5, "block", Reason.AUDIT_UNAVAILABLE)),
    ("not standard", notify(), POLICY, True, None, Answered(4, "error", Reason.BAD_REQUEST)),
    (
        "class CH",
        chaos(),
        POLICY,
        True,
        None,
        Answered(5, "error", Reason.BAD_REQUEST, "x.test", "TXT"),
    ),
    (
        "no host name",
        query("a b.test"),
        POLICY,
        True,
        None,
        Answered(3, "error", Reason.BAD_REQUEST, "a\\032b.test", "A"),
    ),
    (
        "malformed",
        b"\x12\x34\x01\x00\x00\x01" + b"\x00" * 6 + b"\xff",
        POLICY,
        True,
        None,
        Answered(1, "error", Reason.BAD_REQUEST),
    ),
    ("no id: dropped", b"\x12", POLICY, True, None, Answered(None, "error", Reason.BAD_REQUEST)),
    (
        "a response: dropped",
        response(),
        POLICY,
        True,
        None,
        Answered(None, "error", Reason.BAD_REQUEST),
    ),
    (
        "a response, audit closed: dropped",
        response(),
        POLICY,
        False,
        None,
        Answered(None, "error", Reason.BAD_REQUEST),
    ),
    (
        "malformed, audit closed",
        b"\x12\x34" + b"\x00" * 10 + b"\xff",
        POLICY,
        False,
        None,
        Answered(1, "error", Reason.BAD_REQUEST),
    ),
]


@pytest.mark.parametrize(
    ("data", "policy", "audit_ok", "pool", "expected"),
    [row[1:] for row in MATRIX],
    ids=[row[0] for row in MATRIX],
)
def test_dns_query_matrix(
    data: bytes, policy: Policy, audit_ok: bool, pool: FakeIPs | None, expected: Answered
) -> None:
    """Every stage a query can end at: answered, refused by the policy, by the pool, by the
    audit log, or malformed; answered with the DNS table's rcode (or the codec's, for a
    malformed query) and recorded by the exchange."""
    action, wire, event = run(data, policy, audit_ok=audit_ok, pool=pool)
    if expected.rcode is None:
        assert wire is None
        assert event["rcode"] == ""
    else:
        assert wire is not None
        reply = dns.message.from_wire(wire)
        assert reply.rcode() == expected.rcode
        assert reply.flags & dns.flags.QR
        assert reply.id == int.from_bytes(data[:2], "big")
        assert event["rcode"] == RCODE_TEXT[expected.rcode]
        answers = [r.address for rrset in reply.answer for r in rrset]
        assert answers == ([expected.answer] if expected.answer else [])
    assert (event["decision"], event["reason"], event["rule"]) == (
        expected.decision,
        expected.reason.value,
        expected.rule,
    )
    assert (event["host"], event["qtype"]) == (expected.host, expected.qtype)
    assert event.get("answer") == expected.answer
    if isinstance(action, Refuse) and action.verdict.status is None and expected.rcode:
        assert action.answer == DNS.answer(action.verdict.reason)  # the mode's table


def test_the_record_is_the_documented_line() -> None:
    """docs/audit-log.md#dns-records: these fields, in this order, and nothing else (no
    policy hash, no duration: DNS records never had them)."""
    _, _, event = run(query(), transport="tcp")
    assert list(event.items()) == [
        ("client", CLIENT),
        ("method", "DNS"),
        ("scheme", "dns"),
        ("host", "x.test"),
        ("port", 53),
        ("mode", "transparent"),
        ("transport", "tcp"),
        ("client_id", "task-1"),
        ("qtype", "A"),
        ("rcode", "NOERROR"),
        ("decision", "allow"),
        ("reason", "allow_rule"),
        ("rule", "x.test"),
        ("answer", "198.19.128.1"),
    ]
    _, _, refused = run(query("y.test"))
    assert list(refused)[-4:] == ["decision", "reason", "rule", "detail"]
    assert refused["detail"] == "no allow rule matches (default deny)"


def test_report_only_answers_and_records_what_would_happen() -> None:
    policy = Policy(allow=["x.test"], report_only=True)
    action, wire, event = run(query("y.test"), policy)
    assert isinstance(action, Done)
    assert wire is not None
    assert dns.message.from_wire(wire).rcode() == dns.rcode.NOERROR
    assert (event["decision"], event["reason"], event["would"]) == (
        "allow",
        "default_deny",
        "block",
    )
    assert event["detail"] == "report-only, would block: no allow rule matches (default deny)"
    assert list(event)[-2:] == ["detail", "would"]


def test_a_name_keeps_its_fake_address() -> None:
    pool = FakeIPs()
    first = run(query("x.test"), pool=pool)[2]["answer"]
    other = run(query("a.ok.test"), pool=pool)[2]["answer"]
    again = run(query("X.TEST."), pool=pool)[2]["answer"]
    assert first == again != other
    assert pool.name_for(ipaddress.ip_address(str(first))) == "x.test"


def test_an_a_query_asks_the_pool_through_resolve() -> None:
    """The exchange's `Resolve` is the pool's lookup (nothing is forwarded to a resolver);
    an AAAA query never asks for an address."""
    identity = Identity("task-1", POLICY)
    g = gate_for(POLICY)
    x = Exchange(g, DNS)
    action = x.start(
        query_intent(read_query(query()), CLIENT, identity, "udp", audit_ok=True, t0=0)
    )
    assert action == Resolve("x.test")
    x = Exchange(g, DNS)
    q = read_query(query(qtype="AAAA"))
    assert isinstance(x.start(query_intent(q, CLIENT, identity, "udp", audit_ok=True, t0=0)), Done)


def test_rcode_names_are_dnspython_s() -> None:
    for code, text in RCODE_TEXT.items():
        assert dns.rcode.to_text(dns.rcode.Rcode(code)) == text

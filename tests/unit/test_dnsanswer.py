"""The DNS responder's pure part (codec, front-end, exchange): named cases, then hypothesis
(never raises, always an answer with the query's id or a drop)."""

from __future__ import annotations

import ipaddress

import dns.flags
import dns.message
import dns.rcode
import dns.rdatatype
import pytest
from hypothesis import given
from hypothesis import strategies as st

from egress.config import Settings
from egress.policy.addrs import AddressGuard
from egress.policy.judge import judge_name
from egress.policy.rules import Policy
from egress.proxy.codec.dns import FakeIPs, read_query
from egress.proxy.core.actions import Refuse
from egress.proxy.core.clients import ClientTable, Identity
from egress.proxy.core.exchange import Exchange
from egress.proxy.core.gate import Gate
from egress.proxy.modes.dns import play, query_intent, render
from egress.proxy.modes.kinds import DNS

POLICY = Policy(
    allow=["*.allowed.test", "git.test:22", "http://plain.test"],
    block=["bad.allowed.test", "porty.allowed.test:8080"],
    framework_routes=["http://route.test:9000"],
)


class Result:
    """What the responder sends (`response`: None, dropped) and records, for one query."""

    def __init__(self, response: bytes | None, event: dict[str, object]) -> None:
        self.response = response
        self.event = event

    def __getattr__(self, name: str) -> object:
        return self.event.get(name)


def answer_query(data: bytes, policy: Policy, pool: FakeIPs) -> Result:
    """One query through the DNS mode, as the responder plays it (`modes/dns.py`)."""
    gate = Gate(ClientTable(Settings(policy), require_auth=False), AddressGuard())
    query = read_query(data)
    intent = query_intent(
        query, "198.18.0.5:53", Identity("task-1", policy), "udp", audit_ok=True, t0=0
    )
    action = play(Exchange(gate, DNS), intent, pool)
    done = action.done if isinstance(action, Refuse) else action
    event = done.record.event(done.decision, done.reason, done.rule, done.detail, done.status)
    return Result(render(query, action), event)


def ask(name: str, rdtype: str = "A", policy: Policy = POLICY, pool: FakeIPs | None = None):  # type: ignore[no-untyped-def]
    query = dns.message.make_query(name, rdtype)
    result = answer_query(query.to_wire(), policy, pool if pool is not None else FakeIPs())
    assert result.response is not None
    response = dns.message.from_wire(result.response)
    assert response.id == query.id
    assert response.flags & dns.flags.QR
    return result, response


@pytest.mark.parametrize(
    ("name", "reason", "rule"),
    [
        ("www.allowed.test", "allow_rule", "*.allowed.test"),
        ("allowed.test.", "allow_rule", "*.allowed.test"),
        ("GIT.test", "allow_rule", "git.test:22"),
        ("plain.test", "allow_rule", "http://plain.test"),
        ("route.test", "framework_route", "http://route.test:9000"),
        ("porty.allowed.test", "allow_rule", "*.allowed.test"),  # blocked on one port only
    ],
    ids=["wildcard", "apex-trailing-dot", "port-rule", "url-rule", "route", "port-block"],
)
def test_allowed_name_gets_a_fake_address(name: str, reason: str, rule: str) -> None:
    pool = FakeIPs()
    result, response = ask(name, pool=pool)
    assert (result.decision, result.reason, result.rule, result.rcode) == (
        "allow", reason, rule, "NOERROR"
    )  # fmt: skip
    (rrset,) = response.answer
    addr = ipaddress.IPv4Address(rrset[0].address)
    assert addr in ipaddress.IPv4Network("198.19.128.0/17")
    assert pool.name_for(addr) == result.host
    assert ask(name, pool=pool)[0].answer == str(addr)  # stable


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("bad.allowed.test", "block_rule"),
        ("evil.test", "default_deny"),
        ("2130706433", "not_a_name"),
        ("127.0.0.1", "not_a_name"),
        ("0x7f.1", "not_a_name"),
    ],
    ids=["block", "default", "decimal", "dotted", "hex"],
)
def test_refused_name_is_nxdomain(name: str, reason: str) -> None:
    result, response = ask(name)
    assert response.rcode() == dns.rcode.NXDOMAIN
    assert not response.answer
    assert (result.decision, result.reason) == ("block", reason)


def test_aaaa_and_cname_are_nodata_for_allowed_names() -> None:
    for rdtype in ("AAAA", "CNAME", "TXT", "HTTPS"):
        result, response = ask("www.allowed.test", rdtype)
        assert (response.rcode(), response.answer) == (dns.rcode.NOERROR, [])
        assert result.qtype == rdtype
    result, response = ask("evil.test", "AAAA")
    assert response.rcode() == dns.rcode.NXDOMAIN


def test_default_allow_and_address_rules() -> None:
    assert judge_name(Policy(default="allow"), "x.test").reason == "default_allow"
    assert judge_name(Policy(default="allow", block=["x.test"]), "x.test").allowed is False
    assert judge_name(Policy(allow=["198.18.0.0/15"]), "x.test").reason == "default_deny"
    opted = Policy(allow=["198.18.0.0/15"], resolve_names_for_address_rules=True)
    assert judge_name(opted, "x.test").reason == "address_rules"
    # an address rule the guard or the blocks refuse whole answers nothing, even opted in
    guarded = Policy(allow=["127.0.0.1:8089"], resolve_names_for_address_rules=True)
    assert judge_name(guarded, "x.test").reason == "default_deny"
    private = Policy(allow=["10.0.0.0/8"], resolve_names_for_address_rules=True)
    assert judge_name(private, "x.test", AddressGuard(reserve_private=True)).allowed is False
    assert judge_name(private, "x.test").reason == "address_rules"
    blocked = Policy(
        allow=["203.0.113.0/24"], block=["203.0.113.0/24"], resolve_names_for_address_rules=True
    )
    assert judge_name(blocked, "x.test").reason == "default_deny"


def test_pool_exhaustion_is_servfail_never_reuse() -> None:
    pool = FakeIPs("198.19.128.0/30")  # two hosts
    assert ask("a.allowed.test", pool=pool)[0].answer == "198.19.128.1"
    assert ask("b.allowed.test", pool=pool)[0].answer == "198.19.128.2"
    result, response = ask("c.allowed.test", pool=pool)
    assert (response.rcode(), result.reason) == (dns.rcode.SERVFAIL, "pool_exhausted")
    assert pool.name_for(ipaddress.IPv4Address("198.19.128.1")) == "a.allowed.test"


def test_malformed_and_odd_queries() -> None:
    pool = FakeIPs()
    assert answer_query(b"\x12", POLICY, pool).response is None
    result = answer_query(b"\x12\x34" + b"\x01\x00\x00\x01" + b"\x00" * 6 + b"\xff", POLICY, pool)
    assert result.response is not None
    formerr = dns.message.from_wire(result.response, question_only=True)
    assert (formerr.id, formerr.rcode()) == (0x1234, dns.rcode.FORMERR)
    response = dns.message.make_response(dns.message.make_query("a.test", "A"))
    assert answer_query(response.to_wire(), POLICY, pool).response is None  # not a query


@given(st.binary(max_size=600))
def test_fuzz_never_raises(data: bytes) -> None:
    result = answer_query(data, POLICY, FakeIPs())
    if result.response is not None:
        assert result.response[:2] == data[:2]
        assert result.rcode in {"NOERROR", "NXDOMAIN", "FORMERR", "NOTIMP", "REFUSED",
                                "SERVFAIL"}  # fmt: skip


@given(st.text(alphabet="abcdefghij0123456789.-_*\\ \x00é", min_size=1, max_size=80))
def test_fuzz_names(name: str) -> None:
    try:
        query = dns.message.make_query(name, "A")
    except Exception:  # not a name dnspython can encode: nothing to ask
        return
    result = answer_query(query.to_wire(), POLICY, FakeIPs())
    assert result.response is not None
    assert result.decision in ("allow", "block", "error")
    if result.decision == "allow":
        assert result.host.endswith("allowed.test") or result.host in ("git.test", "plain.test")


LABELS = st.sampled_from(["a", "b", "api", "x-1", "allowed", "test", "evil"])
NAMES = st.lists(LABELS, min_size=1, max_size=4).map(".".join)
RULES = st.one_of(
    NAMES,
    NAMES.map(lambda n: "*." + n),
    st.tuples(NAMES, st.sampled_from([22, 80, 443, 8080])).map(lambda t: f"{t[0]}:{t[1]}"),
    NAMES.map(lambda n: "https://" + n),
    NAMES.map(lambda n: "http://" + n + ":8080"),
)


@given(
    allow=st.lists(RULES, max_size=4),
    block=st.lists(RULES, max_size=3),
    default=st.sampled_from(["deny", "allow"]),
    name=NAMES,
)
def test_fuzz_a_refused_name_is_refused_on_every_port(
    allow: list[str], block: list[str], default: str, name: str
) -> None:
    """`judge_name` over-approximates the policy: a name it refuses (NXDOMAIN) is refused by
    `decide` for every scheme and port, so the DNS answer never hides an allowed
    destination; a name it answers may still be refused per connection."""
    from egress.policy.target import make_target

    policy = Policy(allow=allow, block=block, default=default)  # type: ignore[arg-type]
    if judge_name(policy, name).allowed:
        return
    for scheme in ("https", "http"):
        for port in (22, 80, 443, 8080, 9999):
            target = make_target(scheme, name, port)  # type: ignore[arg-type]
            assert not policy.decide(target).allowed, (scheme, port)


def test_report_only_answers_and_says_it_would_block() -> None:
    policy = Policy(allow=["*.allowed.test"], block=["evil.test"], report_only=True)
    result, response = ask("evil.test", policy=policy)
    assert response.rcode() == dns.rcode.NOERROR
    assert response.answer
    assert (result.decision, result.would, result.reason) == ("allow", "block", "block_rule")
    assert result.detail is not None
    assert result.detail.startswith("report-only, would block:")
    assert ask("www.allowed.test", policy=policy)[0].would is None

"""The DNS responder's pure part: a query's bytes in, the answer's bytes and its verdict out.

Strategy. A sandbox in transparent mode sends every DNS query (whatever resolv.conf says) to
the proxy's in-namespace responder. A name is *answered* when some destination under it may
be allowed (`judge_name`); the answer is a synthetic address from the sandbox's own pool
(`FakeIPs`), so that address later identifies the name exactly when a connection to it is
redirected to the proxy; that connection is then judged, resolved and guarded like any other.
A refused name gets NXDOMAIN. Only A is answered with an address; AAAA (IPv6 is off in a cut),
CNAME and other types of an answered name get an empty NOERROR (NODATA), which every stub
resolver accepts. Nothing is ever forwarded to a real resolver, so DNS is no channel out.
See docs/proxy.md#transparent-mode-and-socks5 for the choice of fake addresses.

DoS bounds: a UDP query is at most 64 KiB by construction; the pool is bounded by its network
(32,766 names for the default /17); a full pool answers SERVFAIL rather than reusing an
address for another name. Uses dnspython's wire codec (no socket or resolver part of it).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, replace

import dns.exception
import dns.flags
import dns.message
import dns.opcode
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rdtypes.IN.A
import dns.rrset

from ...errors import TargetError
from ...policy.judge import judge_name
from ...policy.rules import Policy
from ...policy.target import normalize_host, parse_ip_literal

# The default pool: the upper half of 198.19.0.0/16, inside the RFC 2544 benchmarking block
# 198.18.0.0/15, which is never routed on the internet. Inside a cut namespace there is no
# route to it and the backstop drops it, and the proxy's guard reserves it, so a fake address
# is never dialed by anyone (docs/proxy.md#transparent-mode-and-socks5).
DEFAULT_FAKE_NETWORK = "198.19.128.0/17"
# Answers are stable for the sandbox's life; a short TTL still lets a policy change show soon.
ANSWER_TTL = 30


class FakeIPs:
    """A per-sandbox bijection between names and synthetic IPv4 addresses from `network`.

    An address is never reused for another name while the pool lives (a stale cached answer
    must not come to mean a different name)."""

    def __init__(self, network: str = DEFAULT_FAKE_NETWORK) -> None:
        self.network = ipaddress.IPv4Network(network)
        self._by_name: dict[str, ipaddress.IPv4Address] = {}
        self._by_addr: dict[ipaddress.IPv4Address, str] = {}
        self._hosts = self.network.hosts()

    def address_for(self, name: str) -> ipaddress.IPv4Address | None:
        """The name's address (allocated on first use); None when the pool is full."""
        addr = self._by_name.get(name)
        if addr is None:
            addr = next(self._hosts, None)
            if addr is None:
                return None
            self._by_name[name] = addr
            self._by_addr[addr] = name
        return addr

    def name_for(self, addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
        """The name an address was handed out for, or None."""
        if isinstance(addr, ipaddress.IPv4Address):
            return self._by_addr.get(addr)
        return None

    def __len__(self) -> int:
        return len(self._by_name)


@dataclass(frozen=True, slots=True)
class DnsResult:
    """What was answered and why: `response` is None when the query is dropped (too short
    to even carry an id)."""

    response: bytes | None
    host: str
    qtype: str
    rcode: str
    decision: str  # allow | block | error
    reason: str
    rule: str | None = None
    answer: str | None = None
    detail: str | None = None
    would: str | None = None  # report-only: "block" (docs/audit-log.md#report-only-fields)


def answer_query(data: bytes, policy: Policy, pool: FakeIPs) -> DnsResult:
    """Answer one DNS query message (`data`, without a TCP length prefix). Never raises."""
    try:
        query = dns.message.from_wire(data)
    except (dns.exception.DNSException, ValueError, UnicodeError) as exc:
        return _formerr(data, f"malformed DNS query: {exc.__class__.__name__}")
    if query.flags & dns.flags.QR:
        return DnsResult(
            None, "", "", "", "error", "bad_request", detail="a DNS response, not a query"
        )
    asked = _question(query)
    if isinstance(asked, DnsResult):
        return asked
    return _judged(query, asked, policy, pool)


def _question(query: dns.message.Message) -> tuple[str, str] | DnsResult:
    """The name asked (normalized) and its type, or the answer to a question not answered."""
    if query.opcode() != dns.opcode.QUERY or len(query.question) != 1:
        detail = "only single-question standard queries are answered"
        return _reply(query, dns.rcode.NOTIMP, "", "", "error", "bad_request", detail=detail)
    question = query.question[0]
    qtype = dns.rdatatype.to_text(question.rdtype)
    raw = question.name.to_text(omit_final_dot=True)
    if question.rdclass != dns.rdataclass.IN:
        detail = "only class IN is answered"
        return _reply(query, dns.rcode.REFUSED, raw, qtype, "error", "bad_request", detail=detail)
    try:
        host = normalize_host(raw)
    except TargetError as exc:
        return _reply(
            query, dns.rcode.NXDOMAIN, raw[:253], qtype, "error", "bad_request", detail=str(exc)
        )
    if parse_ip_literal(host) is not None:
        detail = "an address spelling is not a name"
        return _reply(query, dns.rcode.NXDOMAIN, host, qtype, "block", "not_a_name", detail=detail)
    return host, qtype


def _judged(
    query: dns.message.Message, asked: tuple[str, str], policy: Policy, pool: FakeIPs
) -> DnsResult:
    """The policy's answer for the name: NXDOMAIN when refused (answered in report-only
    mode, the record saying it would be refused), else a fake address for an A query."""
    host, qtype = asked
    verdict = judge_name(policy, host)
    would = None
    if not verdict.allowed and not policy.report_only:
        return _reply(
            query,
            dns.rcode.NXDOMAIN,
            host,
            qtype,
            "block",
            verdict.reason,
            rule=verdict.rule,
            detail=verdict.detail,
        )
    if not verdict.allowed:  # report-only: answered, the record says it would be refused
        would = f"report-only, would block: {verdict.detail}"
    answer = None
    if query.question[0].rdtype == dns.rdatatype.A:
        addr = pool.address_for(host)
        if addr is None:
            detail = f"fake address pool {pool.network} is full"
            return _reply(
                query, dns.rcode.SERVFAIL, host, qtype, "error", "pool_exhausted", detail=detail
            )
        answer = str(addr)
    result = _reply(
        query,
        dns.rcode.NOERROR,
        host,
        qtype,
        "allow",
        verdict.reason,
        rule=verdict.rule,
        answer=answer,
        detail=would,
    )
    return replace(result, would="block") if would is not None else result


def refuse_query(data: bytes, detail: str) -> DnsResult:
    """REFUSED for any query (the audit log cannot be written: fail closed, like the proxy's
    503 `audit_unavailable`). Never raises."""
    try:
        query = dns.message.from_wire(data)
    except (dns.exception.DNSException, ValueError, UnicodeError):
        return _formerr(data, detail)
    return _reply(query, dns.rcode.REFUSED, "", "", "block", "audit_unavailable", detail=detail)


def _reply(
    query: dns.message.Message,
    rcode: dns.rcode.Rcode,
    host: str,
    qtype: str,
    decision: str,
    reason: str,
    *,
    rule: str | None = None,
    answer: str | None = None,
    detail: str | None = None,
) -> DnsResult:
    """The response with `rcode` (and `answer` as its A record), and what it said and why."""
    response = dns.message.make_response(query)
    response.flags |= dns.flags.RA
    response.set_rcode(rcode)
    if answer is not None:
        name = query.question[0].name
        rdata = dns.rdtypes.IN.A.A(dns.rdataclass.IN, dns.rdatatype.A, answer)  # type: ignore[no-untyped-call]
        response.answer.append(dns.rrset.from_rdata(name, ANSWER_TTL, rdata))
    return DnsResult(
        response.to_wire(),
        host,
        qtype,
        dns.rcode.to_text(rcode),
        decision,
        reason,
        rule,
        answer,
        detail,
    )


def _formerr(data: bytes, detail: str) -> DnsResult:
    """FORMERR echoing the query id, or a drop when there is not even an id."""
    if len(data) < 12:
        return DnsResult(None, "", "", "", "error", "bad_request", detail=detail)
    response = dns.message.Message(id=int.from_bytes(data[:2], "big"))
    response.flags = dns.flags.QR | dns.flags.RA
    response.set_rcode(dns.rcode.FORMERR)
    return DnsResult(response.to_wire(), "", "", "FORMERR", "error", "bad_request", detail=detail)


# -- the wire half of the DNS mode (modes/dns/): a query read, an answer written ---------------
@dataclass(frozen=True, slots=True)
class Query:
    """One query message as read: the name asked (normalized; as written, at most 253
    characters, when it is no host name; empty before the question could be read), its type,
    and `problem`: why it cannot be answered as asked, as (rcode, detail), rcode None when
    nothing can be answered at all (no id, or a response rather than a query)."""

    data: bytes
    message: dns.message.Message | None
    host: str = ""
    qtype: str = ""
    problem: tuple[int | None, str] | None = None


def read_query(data: bytes) -> Query:
    """`data` (without a TCP length prefix) as a `Query`. Never raises."""
    try:
        message = dns.message.from_wire(data)
    except (dns.exception.DNSException, ValueError, UnicodeError) as exc:
        rcode = dns.rcode.FORMERR if len(data) >= 12 else None
        return Query(data, None, problem=(rcode, f"malformed DNS query: {exc.__class__.__name__}"))
    if message.flags & dns.flags.QR:
        return Query(data, None, problem=(None, "a DNS response, not a query"))
    if message.opcode() != dns.opcode.QUERY or len(message.question) != 1:
        problem = (dns.rcode.NOTIMP, "only single-question standard queries are answered")
        return Query(data, message, problem=problem)
    question = message.question[0]
    qtype = dns.rdatatype.to_text(question.rdtype)
    raw = question.name.to_text(omit_final_dot=True)
    if question.rdclass != dns.rdataclass.IN:
        return Query(data, message, raw, qtype, (dns.rcode.REFUSED, "only class IN is answered"))
    try:
        host = normalize_host(raw)
    except TargetError as exc:
        return Query(data, message, raw[:253], qtype, (dns.rcode.NXDOMAIN, str(exc)))
    return Query(data, message, host, qtype)


def respond(query: Query, rcode: int, answer: str | None = None) -> bytes | None:
    """The response to `query`: `rcode`, with `answer` (an IPv4 address) as its A record.
    A message that could not be read is answered by its id alone (None: it has none)."""
    message = query.message
    if message is None:
        if len(query.data) < 12:
            return None
        response = dns.message.Message(id=int.from_bytes(query.data[:2], "big"))
        response.flags = dns.flags.QR | dns.flags.RA
        response.set_rcode(dns.rcode.Rcode(rcode))
        return response.to_wire()
    response = dns.message.make_response(message)
    response.flags |= dns.flags.RA
    response.set_rcode(dns.rcode.Rcode(rcode))
    if answer is not None:
        rdata = dns.rdtypes.IN.A.A(dns.rdataclass.IN, dns.rdatatype.A, answer)  # type: ignore[no-untyped-call]
        response.answer.append(dns.rrset.from_rdata(message.question[0].name, ANSWER_TTL, rdata))
    return response.to_wire()


__all__ = [
    "DEFAULT_FAKE_NETWORK",
    "DnsResult",
    "FakeIPs",
    "Query",
    "answer_query",
    "judge_name",
    "read_query",
    "refuse_query",
    "respond",
]

"""The DNS responder's wire codec: a query's bytes read (`read_query`), an answer written
(`respond`), and `FakeIPs`, the sandbox's own addresses.

Strategy. A sandbox in transparent mode sends every DNS query (whatever resolv.conf says) to
the proxy's in-namespace responder, where it is one exchange like any request
(`modes/dns.py`, docs/architecture.md#one-exchange). A name is *answered* when some
destination under it may be allowed (`policy.judge.judge_name`, through `Gate.lookup`); the
answer is a synthetic address from the sandbox's own pool
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
from dataclasses import dataclass

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
from ...policy.target import normalize_host

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


__all__ = ["DEFAULT_FAKE_NETWORK", "FakeIPs", "Query", "read_query", "respond"]

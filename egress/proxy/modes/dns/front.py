"""The DNS front-end: a query turned into an `Intent`, the exchange's actions into an answer.

Pure. A query is read by the codec (`codec/dns.py`), becomes an `Intent` (method `DNS`, the
name asked, its listener's sandbox), and is played through the same `Exchange` as every other
mode, which decides (`Gate.lookup`) and writes the record; its lookup (`Resolve`) is the
sandbox's own fake-address pool, so nothing waits and nothing is forwarded. The answer is the
exchange's: a name the policy refuses gets NXDOMAIN, a full pool SERVFAIL, a closed audit log
REFUSED (docs/proxy.md#transparent-mode-and-socks5); the table below says so for every reason,
so the audit reasons and the rcodes cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from ....reasons import Reason
from ...codec.dns import FakeIPs, Query, respond
from ...core.actions import Done, Refuse, Resolve
from ...core.clients import Identity
from ...core.exchange import Exchange, SequenceError
from ...core.gate import AUDIT_DOWN
from ...core.gate import Refuse as Verdict
from ...core.intent import Answer, Front, Intent, Question
from ...core.record import DnsRecord

NOERROR: Final = Answer("dns", 0)
FORMERR: Final = Answer("dns", 1)
SERVFAIL: Final = Answer("dns", 2)
NXDOMAIN: Final = Answer("dns", 3)
REFUSED: Final = Answer("dns", 5)

R = Reason
DNS_ANSWERS: Final[Mapping[Reason, Answer]] = {
    R.ALLOW_RULE: NOERROR,
    R.DEFAULT_ALLOW: NOERROR,
    R.FRAMEWORK_ROUTE: NOERROR,
    R.ADDRESS_RULES: NOERROR,  # answered; each connection judged on its address
    R.BLOCK_RULE: NXDOMAIN,
    R.DEFAULT_DENY: NXDOMAIN,
    R.PORT_NOT_ALLOWED: NXDOMAIN,
    R.RESERVED_ADDRESS: NXDOMAIN,
    R.NOT_A_NAME: NXDOMAIN,
    R.SNI_MISMATCH: NXDOMAIN,
    R.SNI_MISSING: NXDOMAIN,
    R.AUTH_REQUIRED: REFUSED,
    R.AUTH_FAILED: REFUSED,
    R.DNS_ERROR: SERVFAIL,
    R.DNS_TIMEOUT: SERVFAIL,
    R.CONNECTION_REFUSED: SERVFAIL,
    R.CONNECTION_TIMEOUT: SERVFAIL,
    R.UPSTREAM_ERROR: SERVFAIL,
    R.POOL_EXHAUSTED: SERVFAIL,
    # a malformed query: FORMERR (a non-standard opcode gets NOTIMP, a class other than IN
    # REFUSED, a name that is no name NXDOMAIN: the codec's `read_query` says which)
    R.BAD_REQUEST: FORMERR,
    R.HEAD_TOO_LARGE: FORMERR,
    R.HEAD_TIMEOUT: REFUSED,
    R.COMMAND_NOT_SUPPORTED: REFUSED,
    R.ADDRESS_TYPE_NOT_SUPPORTED: REFUSED,
    R.NOT_REDIRECTED: REFUSED,
    R.TOO_MANY_CONNECTIONS: REFUSED,
    R.AUDIT_UNAVAILABLE: REFUSED,
    R.IDENTIFY_TIMEOUT: REFUSED,
    R.EVICTED: REFUSED,
    R.SANDBOX_ADDED: NOERROR,
    R.SANDBOX_REPLACED: NOERROR,
    R.SANDBOX_REMOVED: REFUSED,
    R.LISTENER_PROBE: NOERROR,
}

# DNS records are transparent mode's, and record a closed audit log as `block`
# (docs/audit-log.md#dns-records)
DNS: Final = Front(
    "dns",
    "transparent",
    "lookup",
    None,
    DNS_ANSWERS,
    decisions={R.AUDIT_UNAVAILABLE: "block"},
)


def query_intent(
    query: Query, client: str, identity: Identity, transport: str, *, audit_ok: bool, t0: int
) -> Intent:
    """A query as an `Intent`: a malformed one is a `bad_request` refusal answered with the
    codec's rcode (or not at all: no id, or a response); with the audit log closed, any
    query that can be answered is refused before its question is looked at."""
    problem = query.problem
    if not audit_ok:
        if query.message is not None and (problem is None or problem[0] is not None):
            question = Question("", transport)
            return Intent(
                client, "DNS", "dns", "", 53, t0, None, identity, audit_ok=False, question=question
            )
        problem = (problem[0] if problem is not None else None, AUDIT_DOWN.detail)
    target = None
    answerable = True
    if problem is not None:
        rcode, detail = problem
        target = Verdict(Reason.BAD_REQUEST, detail, status=rcode)
        answerable = rcode is not None
    host = query.host if audit_ok else ""
    qtype = query.qtype if audit_ok else ""
    question = Question(qtype, transport)
    return Intent(
        client,
        "DNS",
        "dns",
        host,
        53,
        t0,
        target,
        identity,
        answerable=answerable,
        question=question,
    )


def play(x: Exchange, intent: Intent, pool: FakeIPs) -> Refuse | Done:
    """The whole exchange of one query, at once: its lookup is the sandbox's own pool (a
    full pool is `pool_exhausted`, SERVFAIL), so nothing is awaited."""
    action = x.start(intent)
    if isinstance(action, Resolve):
        addr = pool.address_for(action.host)
        if addr is None:
            full = Verdict(Reason.POOL_EXHAUSTED, f"fake address pool {pool.network} is full")
            return x.resolve_failed(full)
        action = x.resolved((addr,))
    if not isinstance(action, (Refuse, Done)):
        raise SequenceError(f"exchange: {action!r} in a DNS exchange")
    return action


def render(query: Query, action: Refuse | Done) -> bytes | None:
    """The answer to `query` as the exchange ended it (None: dropped, nothing to answer)."""
    if isinstance(action, Refuse):
        answer = action.answer
        return respond(query, answer.code) if answer.style == "dns" else None
    record = action.record
    return respond(query, 0, record.answer if isinstance(record, DnsRecord) else None)


__all__ = ["DNS", "DNS_ANSWERS", "play", "query_intent", "render"]

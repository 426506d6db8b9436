"""A DNS query's exchange: the query turned into an `Intent`, played, and answered.

Pure. A query is read by the codec (`codec/dns.read_query`), becomes an `Intent` (method
`DNS`, the name asked, its listener's sandbox), and is played through the same `Exchange` as
every other mode, which decides (`Gate.lookup`) and writes the record; its lookup (`Resolve`)
is the sandbox's own fake-address pool, so nothing waits and nothing is forwarded. The answer
is the exchange's, in the mode's table (`front.py`), written by the codec (`respond`).
"""

from __future__ import annotations

from ....reasons import Reason
from ...codec.dns import FakeIPs, Query, respond
from ...core.actions import Done, Refuse
from ...core.clients import Identity
from ...core.exchange import Exchange, SequenceError, State
from ...core.gate import AUDIT_DOWN, Verdict
from ...core.intent import Intent, Question
from ...core.record import DnsRecord


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
    if x.state is State.RESOLVING:  # an A query: its lookup (`Resolve`) is the pool's
        addr = pool.address_for(intent.host)
        if addr is None:
            full = Verdict(Reason.POOL_EXHAUSTED, f"fake address pool {pool.network} is full")
            return x.resolve_failed(full)
        action = x.resolved((addr,))
    if not isinstance(action, Refuse | Done):
        raise SequenceError(f"exchange: {action!r} in a DNS exchange")
    return action


def render(query: Query, action: Refuse | Done) -> bytes | None:
    """The answer to `query` as the exchange ended it (None: dropped, nothing to answer)."""
    if isinstance(action, Refuse):
        answer = action.answer
        return respond(query, answer.code) if answer.style == "dns" else None
    record = action.record
    return respond(query, 0, record.answer if isinstance(record, DnsRecord) else None)


__all__ = ["play", "query_intent", "render"]

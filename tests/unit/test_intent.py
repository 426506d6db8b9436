"""A front-end as data (egress/proxy/core/intent.py): its answer for a reason, and the
`decision` its records spell for one, which a mode may override (docs/audit-log.md)."""

from __future__ import annotations

from egress.proxy.core.intent import CLOSE, Answer, Front
from egress.proxy.modes.kinds import DNS, HTTP
from egress.reasons import Reason


def test_a_front_answers_from_its_table() -> None:
    table = dict.fromkeys(Reason, CLOSE) | {Reason.BLOCK_RULE: Answer("http", 403)}
    front = Front("test", None, "request", None, table)
    assert front.answer(Reason.BLOCK_RULE) == Answer("http", 403)
    assert front.answer(Reason.DNS_ERROR) is CLOSE


def test_a_decision_is_the_reasons_unless_the_mode_spells_it_otherwise() -> None:
    """DNS records a closed audit log as `block` (docs/audit-log.md#dns-records); every other
    reason, and every reason of a mode without overrides, keeps its own decision."""
    audit = Reason.AUDIT_UNAVAILABLE
    assert HTTP.decision(audit) == audit.decision == "error"
    assert DNS.decision(audit) == "block"
    for reason in Reason:
        if reason is not audit:
            assert DNS.decision(reason) == reason.decision == HTTP.decision(reason)

"""The audit log's budget per sandbox: bounded fields, the refusal tally's burst, the byte
budget per client (docs/audit-log.md#the-budget-per-sandbox)."""

from __future__ import annotations

import hashlib

from hypothesis import given
from hypothesis import strategies as st

from egress.proxy.core.record import FIELD_LIMIT, AccessRecord, bounded
from egress.proxy.logbudget import PER_SECOND, LogBudget
from egress.proxy.tally import Tally


@given(st.text(max_size=3 * FIELD_LIMIT))
def test_bounded_keeps_short_text_and_cuts_long_text_with_a_digest(text: str) -> None:
    out = bounded(text)
    if len(text) <= FIELD_LIMIT:
        assert out == text
        return
    assert out.startswith(text[:FIELD_LIMIT])
    rest = text[FIELD_LIMIT:].encode("utf-8", "surrogatepass")
    assert out == (
        f"{text[:FIELD_LIMIT]}...[+{len(text) - FIELD_LIMIT} chars "
        f"sha256:{hashlib.sha256(rest).hexdigest()[:16]}]"
    )
    assert len(out) < FIELD_LIMIT + 64


def test_bounded_never_digests_a_query_string() -> None:
    path = "/" + "a" * FIELD_LIMIT + "b" * 10 + "?key=sk-secret"
    out = bounded(path, query=True)
    digest = hashlib.sha256(b"a" + b"b" * 10).hexdigest()[:16]  # the cut part before "?"
    assert out.endswith(f"...[+{len(path) - FIELD_LIMIT} chars sha256:{digest}]?...")


def test_a_record_bounds_every_field_an_agent_chooses() -> None:
    rec = AccessRecord("198.18.0.2:1", "CONNECT", "https", "x" * 15000, 0, 0)
    rec.path = "/" + "p" * 15000
    ev = rec.event("error", "bad_request", None, "CONNECT target '" + "x" * 15000 + "'", 400)
    for key in ("host", "path", "detail"):
        assert len(str(ev[key])) < FIELD_LIMIT + 64, key


def test_the_tally_writes_a_burst_then_counts() -> None:
    tally: Tally[int] = Tally(burst=3)
    written = [tally.add("k", n, 0.1 * n) for n in range(6)]
    assert written[:3] == [[(0, 1)], [(1, 1)], [(2, 1)]]
    assert written[3:] == [[], [], []]
    assert tally.seen("k", 0.55) == 6
    assert tally.due(1.0) == [(5, 3)]  # the last of the window, standing for three


def test_the_budget_holds_a_client_to_its_bytes_and_says_what_it_left_out() -> None:
    budget = LogBudget()
    size = 1000
    kept = 0
    ended = []
    for n in range(200):  # 200 records of 1000 bytes in one second
        ok, out = budget.take(
            "flooder", size, n * 0.004, count=2, reason="default_deny", client="c", client_id="f"
        )
        kept += ok
        ended += out
    assert kept == PER_SECOND // size
    assert ended == []
    ok, _ = budget.take(
        "calm", size, 0.5, count=1, reason="default_deny", client="d", client_id="calm"
    )
    assert ok  # another client has its own budget
    (left_out,) = budget.due(1.0)
    event = left_out.event(1.0)
    assert event["type"] == "suppressed"
    assert event["records"] == 200 - kept
    assert event["refusals"] == 2 * (200 - kept)
    assert event["bytes"] == size * (200 - kept)
    assert event["reasons"] == {"default_deny": 2 * (200 - kept)}
    assert event["client_id"] == "f"
    ok, _ = budget.take(
        "flooder", size, 1.2, count=1, reason="default_deny", client="c", client_id="f"
    )
    assert ok  # a new second, a new budget

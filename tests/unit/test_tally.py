"""The refusal tally, as pure data (egress/proxy/tally.py): the first refusal of a key in a
window is written, the rest counted into one record when the window ends, and a flood is
answered in full only for its first refusals (docs/audit-log.md#aggregated-refusals)."""

from __future__ import annotations

from egress.proxy.tally import ANSWERED, Tally, answer_in_full


def test_tally_writes_the_first_and_then_one_count_per_window() -> None:
    t: Tally[str] = Tally(1.0)
    assert t.add("k", "r1", 0.0) == [("r1", 1)]
    assert t.add("k", "r2", 0.1) == []
    assert t.add("k", "r3", 0.2) == []
    assert t.add("other", "o1", 0.3) == [("o1", 1)]
    assert t.due(0.5) == []
    assert t.due(1.1) == [("r3", 2)]
    assert t.add("k", "r4", 1.2) == [("r4", 1)]
    assert t.add("k", "r5", 1.3) == []
    assert t.add("k", "r6", 2.3) == [("r5", 1), ("r6", 1)]
    assert t.due(2.4, everything=True) == []


def test_tally_seen_counts_the_open_window_only() -> None:
    t: Tally[str] = Tally(1.0)
    assert t.seen("k", 0.0) == 0
    t.add("k", "r1", 0.0)
    assert t.seen("k", 0.5) == 1
    t.add("k", "r2", 0.6)
    t.add("k", "r3", 0.7)
    assert (t.seen("k", 0.9), t.seen("other", 0.9)) == (3, 0)
    assert t.seen("k", 1.0) == 0  # the window has ended: a new one starts at the next refusal
    t.add("k", "r4", 1.2)
    assert t.seen("k", 1.3) == 1


def test_a_flood_is_answered_in_full_only_for_its_first_refusals() -> None:
    table = {0: True, 1: True, ANSWERED - 1: True, ANSWERED: False, ANSWERED + 1: False,
             10 * ANSWERED: False}  # fmt: skip
    for seen, full in table.items():
        assert answer_in_full(seen) is full, seen

"""Connection slots, as pure data (egress/proxy/admission.py; the refusal tally: test_tally.py)."""

from __future__ import annotations

from egress.proxy.admission import CLIENT_FULL, GLOBAL_FULL, PRESENT_FOR, Admitted, Budget, Slots


def slots(total: int = 8, cap: int = 4, per_source: int = 2, unknown: int = 3) -> Slots[str]:
    return Slots(Budget(total, cap, per_source, unknown))


def test_a_known_client_is_capped_from_accept() -> None:
    s = slots()
    for i in range(4):
        assert s.admit(f"a{i}", "a", "10.0.0.1", 0.0) == Admitted()
    assert s.admit("a4", "a", "10.0.0.1", 0.0) is CLIENT_FULL
    assert s.count("a") == 4
    s.release("a0")
    assert s.admit("a4", "a", "10.0.0.1", 0.0) == Admitted()


def test_a_full_source_budget_evicts_its_own_oldest() -> None:
    s = slots()
    assert s.admit("u0", None, "127.0.0.1", 0.0) == Admitted()
    assert s.admit("u1", None, "127.0.0.1", 1.0) == Admitted()
    assert s.admit("u2", None, "127.0.0.1", 2.0) == Admitted(("u0",))
    assert s.unidentified == 2
    assert s.overdue(3.5, 2.0) == ["u1"]


def test_the_total_budget_evicts_from_the_largest_source() -> None:
    s = slots(per_source=3, unknown=3)
    for i in range(3):
        s.admit(f"x{i}", None, "10.0.0.9", float(i))
    assert s.admit("y0", None, "10.0.0.2", 9.0) == Admitted(("x0",))


def test_unidentified_never_fill_the_proxy_and_known_clients_displace_them() -> None:
    s = slots(total=4, cap=4, per_source=4, unknown=4)
    for i in range(4):
        s.admit(f"u{i}", None, "127.0.0.1", float(i))
    # the global cap is reached: a known client takes an unidentified one's place
    assert s.admit("a0", "a", "127.0.0.1", 5.0) == Admitted(("u0",))
    for i in range(1, 4):
        s.identify(f"u{i}", "b")
    assert s.admit("u9", None, "127.0.0.1", 6.0) is GLOBAL_FULL
    assert s.admit("a1", "a", "127.0.0.1", 6.0) is GLOBAL_FULL
    assert s.admit("a1", "a", "127.0.0.1", 6.0, reclaimable=True) == Admitted()


def test_identify_moves_the_slot_and_respects_the_cap() -> None:
    s = slots(cap=1)
    s.admit("k", "a", "10.0.0.1", 0.0)
    s.admit("u", None, "10.0.0.1", 0.0)
    assert s.identify("u", "a") is CLIENT_FULL
    assert s.owner("u") is None
    assert s.identify("u", "b") is None
    assert (s.owner("u"), s.unidentified, s.total) == ("b", 0, 2)
    s.release("u")
    s.release("u")  # idempotent
    assert s.total == 1


def test_over_cap_answers_what_admit_would_from_the_owner_alone() -> None:
    """`over_cap` lets the shell refuse before it builds a connection: for every fill of
    the owner's cap it agrees with `admit` (docs/proxy.md#limits)."""
    for cap in (1, 2, 4):
        s = slots(total=64, cap=cap)
        for held in range(cap + 1):
            expected = CLIENT_FULL if held >= cap else None
            assert s.over_cap("a") is expected
            assert s.over_cap("b") is None  # another client's fill never counts
            verdict = s.admit(f"probe{held}", "a", "10.0.0.1", 0.0)
            assert (verdict is CLIENT_FULL) == (expected is CLIENT_FULL)
            if held < cap:
                assert verdict == Admitted()


def test_presence_for_the_fair_share() -> None:
    """Another client is present while it holds a connection and for `present_for` seconds
    after its last one closed; unidentified connections do not count (docs/proxy.md#fair-share)."""
    s = slots()
    s.admit("a0", "a", "10.0.0.1", 0.0)
    s.admit("u", None, "10.0.0.9", 0.0)
    assert not s.others_present("a", 0.0)
    s.admit("b0", "b", "10.0.0.2", 0.0)
    s.admit("b1", "b", "10.0.0.2", 0.0)
    assert s.others_present("a", 0.0)
    assert s.others_present("b", 0.0)
    s.release("b0", 1.0)
    assert s.others_present("a", 1.0)  # b still holds one
    s.release("b1", 2.0)
    assert s.others_present("a", 2.0 + s.present_for / 2)  # b left a moment ago
    assert s.others_present("b", 2.0)  # a holds a connection
    assert not s.others_present("a", 2.0 + s.present_for)
    s.release("a0", 3.0)  # a leaves after b
    assert s.others_present("b", 3.0 + s.present_for / 2)
    assert s.others_present("a", 2.0 + s.present_for / 2)  # b left before a, a moment ago
    assert not s.others_present("a", 2.0 + s.present_for)
    assert not s.others_present("b", 3.0 + s.present_for)


def test_an_occasional_client_stays_present_between_its_requests() -> None:
    """Issue 32: a client asking every second or two, a connection per request, was gone
    after one second, so a flooder was always alone and uncapped when it came back (its
    p50 went from 2.0 to 24.6-30.5 ms). It stays present for `PRESENT_FOR` (30 s)."""
    s = slots()
    assert s.present_for == PRESENT_FOR >= 30.0
    s.admit("f", "flooder", "10.0.0.1", 0.0)
    for t in (0.0, 2.5, 5.0, 20.0):  # the occasional client: one request, then gone a while
        s.admit(("o", t), "occasional", "10.0.0.2", t)
        s.release(("o", t), t + 0.01)
        assert s.others_present("flooder", t + 2.0)
        assert s.others_present("flooder", t + 10.0)

"""The descriptor budget as pure data (egress/proxy/fdbudget.py, docs/proxy.md#file-descriptors)."""

from __future__ import annotations

from egress.proxy.fdbudget import SCARCE_BURST, AcceptFailures, fds_needed, plan_fds


def test_enough_descriptors_change_nothing() -> None:
    need = fds_needed(1024, 1024, 20)
    assert plan_fds(1024, 1024, 20, need, None).soft == need
    assert plan_fds(1024, 1024, 20, need + 5, need + 5).note is None


def test_a_low_soft_limit_is_raised_to_what_the_cap_needs() -> None:
    plan = plan_fds(1024, 1024, 20, 1024, 1_048_576)
    assert (plan.soft, plan.max_connections, plan.note) == (fds_needed(1024, 1024, 20), 1024, None)
    assert plan_fds(1024, 1024, 20, 1024, None).max_connections == 1024


def test_a_low_hard_limit_lowers_the_cap_and_says_so() -> None:
    plan = plan_fds(1024, 1024, 20, 256, 256)
    assert plan.soft == 256
    # the listen backlog keeps its length: a short one overflowed under a burst of clients,
    # the kernel dropped their SYNs and they waited out retransmits with no answer
    assert plan.backlog == 1024
    assert 1 <= plan.max_connections < 128
    assert fds_needed(plan.max_connections, SCARCE_BURST, 20) <= 256
    assert fds_needed(plan.max_connections + 1, SCARCE_BURST, 20) > 256
    assert plan.note is not None
    assert "serving at most" in plan.note


def test_accept_failures_are_logged_once_per_second_with_a_count() -> None:
    f = AcceptFailures()
    assert f.failed(0.0) == 1
    assert [f.failed(0.1 * i) for i in range(1, 10)] == [None] * 9
    assert f.failed(1.05) == 10
    assert f.failed(1.5) is None

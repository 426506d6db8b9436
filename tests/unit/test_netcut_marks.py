"""A restore reads netcut's marks only (`NamespaceState.marks()`, flow.restore): whatever the
rest of the namespace holds, the marks alone give the same answers as the whole state to
the two questions a restore asks, "is it cut at all?" and "what is undone?". A shortcut that
lost a mark (a marked route in another table, one family's backstop, the redirects) or that
read a state the answers depend on would make these differ; tests/netcut/test_netcut_marks_kernel.py
checks that direct mode's read of the marks is the projection of its whole read on a real
kernel.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from netcut.plan.model import AF_INET, AF_INET6, NETCUT_PROTO, NamespaceState, Route
from netcut.plan.planner import plan_restore
from netcut.plan.status import judge_status
from tests.unit.test_netcut_verify import CUT, PLAN, before

_TABLES = (100, 253, 254, 255)


@st.composite
def namespaces(draw: st.DrawFn) -> NamespaceState:
    """The cut namespace or the one before it, then tampered with: routes added (some of them
    carrying netcut's mark) or removed, a family's backstop or the redirects there or not,
    sysctls and addresses dropped."""
    base = draw(st.sampled_from([CUT, before()]))
    kept = tuple(r for r in base.routes if draw(st.booleans()))
    added = []
    for i in range(draw(st.integers(0, 4))):
        family = draw(st.sampled_from([AF_INET, AF_INET6]))
        dst = f"198.18.{i}.0" if family == AF_INET else f"2001:db8:{i}::"
        added.append(
            Route(
                family,
                dst,
                draw(st.integers(8, 32)),
                draw(st.sampled_from([1, 2, None])),
                None,
                table=draw(st.sampled_from(_TABLES)),
                proto=draw(st.sampled_from([NETCUT_PROTO, 3, 4])),
            )
        )
    families = draw(st.lists(st.sampled_from([AF_INET, AF_INET6]), unique=True, max_size=2))
    return replace(
        base,
        routes=(*kept, *added),
        backstop=tuple(sorted(families)),
        filters=base.filters if draw(st.booleans()) else None,
        redirect=draw(st.booleans()),
        sysctls=base.sysctls if draw(st.booleans()) else (),
        addrs=base.addrs if draw(st.booleans()) else (),
    )


_RECORDS = st.sampled_from(
    [None, PLAN, replace(PLAN, applied=0), replace(PLAN, applied=len(PLAN.ops) // 2)]
)


@given(namespaces(), _RECORDS)
def test_the_marks_answer_what_a_restore_asks_as_the_whole_state_does(
    state: NamespaceState, record: object
) -> None:
    marks = state.marks()
    whole = judge_status(record, state)  # type: ignore[arg-type]
    part = judge_status(record, marks)  # type: ignore[arg-type]
    assert (whole.state == "not cut") == (part.state == "not cut")
    if whole.state == "not cut":
        assert part == whole
    assert plan_restore(record, marks) == plan_restore(record, state)  # type: ignore[arg-type]
    # the check after a restore: judged without a record
    assert judge_status(None, marks) == judge_status(None, state)


def test_the_marks_of_a_cut_are_its_marked_routes_backstop_and_redirects() -> None:
    marked = Route(AF_INET, "198.18.9.0", 24, 2, "eth0", table=100, proto=NETCUT_PROTO)
    state = replace(CUT, routes=(*CUT.routes, marked), redirect=True)
    marks = state.marks()
    assert marks.routes == state.marked_routes
    assert marked in marks.routes
    assert marks.backstop == CUT.backstop == (AF_INET, AF_INET6)
    assert marks.redirect
    assert marks.links == CUT.links
    assert (marks.addrs, marks.sysctls, marks.filters, marks.policy_rules) == ((), (), None, None)

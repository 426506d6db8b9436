"""Is a namespace cut? The recorded plan against the live state, as a `CutStatus`. Pure.

"cut" only when the whole live state matches the recorded plan (`verify.differences`);
marks or a record without the rest are "partial", and a record without any mark in the
namespace is stale (docs/netcut.md#status).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from netcut.plan.model import AF_INET6, Keep, NamespaceState
from netcut.plan.verify import differences, unverified

if TYPE_CHECKING:
    from netcut.plan.planner import CutPlan


@dataclass(frozen=True)
class CutStatus:
    """Whether a namespace is cut. `state` is "cut" (the whole live state matches the
    recorded plan: plan/verify.py), "not cut" (no record, no marks), or "partial" (marks or a
    record, but the state differs: not a cut; `details` lists every difference, a second
    `cut` repairs it and `restore` undoes it)."""

    state: Literal["cut", "not cut", "partial"]
    keeps: tuple[Keep, ...] = ()
    details: tuple[str, ...] = ()

    @property
    def is_cut(self) -> bool:
        return self.state == "cut"

    def lines(self) -> list[str]:
        extra = []
        if self.state == "partial":
            extra.append("not a cut: run `netcut cut` to repair it or `netcut restore`")
        if self.keeps:
            extra.append("keep: " + ", ".join(str(k) for k in self.keeps))
        elif self.is_cut:
            extra.append("keep: loopback only")
        return [self.state, *extra, *self.details]


def judge_status(record: CutPlan | None, state: NamespaceState) -> CutStatus:
    """Compare the whole namespace with the recorded plan (docs/netcut.md#status)."""
    if record is None:
        if state.marked_routes or state.backstop or state.redirect:
            marks = [f"marked route {r}" for r in state.marked_routes]
            marks += [f"{'IPv6' if f == AF_INET6 else 'IPv4'} backstop" for f in state.backstop]
            marks += ["redirects"] if state.redirect else []
            return CutStatus("partial", details=("no restore record", *marks))
        return CutStatus("not cut")
    if not state.marked_routes and not state.backstop and not state.redirect:
        # The backstop is a cut's first change: a record without any mark in the namespace
        # belongs to a cut that never started, or to an earlier namespace whose inode was
        # reused. Undoing it here would add another namespace's routes.
        return CutStatus("not cut", details=("stale record ignored",))
    found = differences(record.ops, state)
    if found:
        return CutStatus("partial", record.keeps, found)
    return CutStatus("cut", record.keeps, (*unverified(state), *(f"  {op}" for op in record.ops)))

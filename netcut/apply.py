"""The executor: one dispatcher that turns plan ops into netlink, sysctl and netfilter calls,
plus the jobs that run inside the namespace (nsexec.run_in_netns) for cut, status, restore.

Strategy. A cut writes its record (records.py) *before* the first change, then applies ops one
by one, remembering each that succeeded; when one fails, the inverses of the done ops run in
reverse order (best effort, each one tolerant) and ApplyFailed is raised; the record is
removed only when the rollback itself completed, else it stays for `restore`. Restore ops are
tolerant by design: putting back a route that exists, or removing one that is gone, is not an
error, so restore can finish a rollback or a cut that was killed midway.
"""

from __future__ import annotations

import errno
import time
from dataclasses import dataclass

from iptc import IPTCError

from netcut import backstop, flows, nat, plan, verify
from netcut.errors import ApplyFailed
from netcut.model import (
    AddAddr,
    AddBackstop,
    AddRedirect,
    AddRoute,
    DelAddr,
    DelRoute,
    Keep,
    KillFlows,
    NamespaceState,
    Op,
    RemoveBackstop,
    RemoveRedirect,
    SetSysctl,
)
from netcut.plan import CutPlan, CutStatus
from netcut.records import Store
from netcut.redirect import Redirect
from netcut.rtnl import NetlinkError, Rtnl
from netcut.state import read_state

_GONE = (errno.ESRCH, errno.ENOENT, errno.EADDRNOTAVAIL, errno.ENODEV)


def apply_op(rt: Rtnl, op: Op, *, tolerant: bool = False) -> None:
    """Run one op. `tolerant`: an add of what exists or a delete of what is gone passes."""
    try:
        _dispatch(rt, op)
    except NetlinkError as exc:
        if tolerant and (exc.code == errno.EEXIST or exc.code in _GONE):
            return
        raise ApplyFailed(f"{op}: {exc.args[-1] if exc.args else exc}") from None
    except OSError as exc:
        raise ApplyFailed(f"{op}: {exc.strerror or exc}") from None
    except IPTCError as exc:
        raise ApplyFailed(f"{op}: {exc}") from None


def _dispatch(rt: Rtnl, op: Op) -> None:
    if isinstance(op, AddRoute | DelRoute):
        rt.route(isinstance(op, AddRoute), op.route)
    elif isinstance(op, AddAddr | DelAddr):
        rt.addr(isinstance(op, AddAddr), op.addr)
    elif isinstance(op, SetSysctl):
        with open(f"/proc/sys/{op.key}", "w") as f:
            f.write(op.value)
    elif isinstance(op, AddBackstop):
        backstop.install(op.family, op.rules)
    elif isinstance(op, RemoveBackstop):
        backstop.remove(op.family)
    elif isinstance(op, KillFlows):
        flows.kill_flows(op.allowed)
    elif isinstance(op, AddRedirect):
        nat.install(op.rules)
    elif isinstance(op, RemoveRedirect):
        nat.remove()
    else:
        raise RuntimeError(f"unexpected {op!r}")


def apply_plan(rt: Rtnl, ops: tuple[Op, ...]) -> None:
    """Apply `ops` in order; on a failure roll back what was done and raise ApplyFailed."""
    done: list[Op] = []
    for op in ops:
        try:
            apply_op(rt, op)
        except ApplyFailed as exc:
            leftovers = rollback(rt, done)
            note = f"; rollback incomplete: {'; '.join(leftovers)}" if leftovers else ""
            msg = f"cut failed at: {exc}; rolled back {len(done)} change(s){note}"
            raise ApplyFailed(msg, rolled_back=not leftovers) from None
        done.append(op)


def rollback(rt: Rtnl, done: list[Op]) -> list[str]:
    """Undo `done` in reverse order; return the errors of undo steps that failed."""
    errors = []
    for op in reversed(done):
        inverse = plan.invert(op)
        if inverse is None:
            continue
        try:
            apply_op(rt, inverse, tolerant=True)
        except ApplyFailed as exc:
            errors.append(str(exc))
    return errors


# ---------------------------------------------------------------- jobs run inside the namespace


@dataclass(frozen=True)
class JobResult:
    """What a job inside the namespace reports back to the caller."""

    status: CutStatus
    plan: CutPlan | None = None
    changed: bool = False
    lines: tuple[str, ...] = ()
    elapsed_ms: float = 0.0
    repaired: bool = False  # a partial cut was brought back to its recorded plan


def job_apply(ops: tuple[Op, ...]) -> None:
    """Apply arbitrary ops with rollback (tests use it to inject a failure midway)."""
    with Rtnl() as rt:
        apply_plan(rt, ops)


def job_status(store: Store) -> JobResult:
    with Rtnl() as rt:
        record = store.load()
        state = read_state(rt, verify=True)
        return JobResult(plan.judge_status(record, state), record)


def job_cut(
    store: Store,
    keeps: tuple[Keep, ...],
    nameservers: tuple[str, ...],
    dry_run: bool,
    meta: dict[str, str],
    redirect: Redirect | None = None,
) -> JobResult:
    """Plan and (unless `dry_run`) apply a cut. An existing complete cut is left as it is; a
    partial one with the same keeps is repaired to its recorded plan, any other partial one
    is restored first."""
    start = time.perf_counter()
    with store.locked(), Rtnl() as rt:
        record = store.load()
        state = read_state(rt, keeps, nameservers, verify=record is not None)
        status = plan.judge_status(record, state)
        if status.is_cut:
            return JobResult(status, record, changed=False)
        if status.state == "partial" and record is not None and set(record.keeps) == set(keeps):
            return _repair(rt, record, state, dry_run, start)
        if status.state == "partial" and not dry_run:
            _restore(rt, store, record, state)
            state = read_state(rt, keeps, nameservers)
        cut = plan.plan_cut(state, keeps, redirect)
        if dry_run:
            return JobResult(status, cut, lines=tuple(cut.lines()))
        store.save(cut, meta)
        try:
            apply_plan(rt, cut.ops)
        except ApplyFailed as exc:
            if exc.rolled_back:
                store.remove()  # else keep it: `restore` finishes what the rollback could not
            raise
        elapsed = (time.perf_counter() - start) * 1000
        return JobResult(CutStatus("cut", cut.keeps), cut, changed=True, elapsed_ms=elapsed)


def _repair(
    rt: Rtnl, record: CutPlan, state: NamespaceState, dry_run: bool, start: float
) -> JobResult:
    """Bring a tampered cut back to its recorded plan (docs/netcut.md#status). The record is
    kept as it is, so a later restore puts back the state from before the cut, never what
    was added meanwhile. No rollback: every step closes the namespace further, so a failed
    step is reported (ApplyFailed, not rolled back) and the rest still runs."""
    ops = verify.repair_ops(record.ops, state)
    fix = CutPlan(record.keeps, ops, record.nameservers)
    before = plan.judge_status(record, state)
    if dry_run:
        return JobResult(before, fix, lines=tuple(fix.lines()), repaired=True)
    errors = []
    for op in ops:
        try:
            apply_op(rt, op, tolerant=True)
        except ApplyFailed as exc:
            errors.append(str(exc))
    after = plan.judge_status(record, read_state(rt, verify=True))
    if errors or not after.is_cut:
        left = "; ".join([*errors, *after.details])
        raise ApplyFailed(f"repair of the partial cut incomplete: {left}", rolled_back=False)
    elapsed = (time.perf_counter() - start) * 1000
    return JobResult(after, fix, changed=True, elapsed_ms=elapsed, repaired=True,
                     lines=before.details)  # fmt: skip


def job_restore(store: Store) -> JobResult:
    start = time.perf_counter()
    with store.locked(), Rtnl() as rt:
        record = store.load()
        state = read_state(rt)
        before = plan.judge_status(record, state)
        if before.state == "not cut":
            store.remove()
            return JobResult(before)
        lines = _restore(rt, store, record, state)
        after = plan.judge_status(None, read_state(rt))
        elapsed = (time.perf_counter() - start) * 1000
        return JobResult(after, record, changed=True, lines=lines, elapsed_ms=elapsed)


def _restore(
    rt: Rtnl, store: Store, record: CutPlan | None, state: NamespaceState
) -> tuple[str, ...]:
    undo = plan.plan_restore(record, state)
    errors = []
    for op in undo.ops:
        try:
            apply_op(rt, op, tolerant=True)
        except ApplyFailed as exc:
            errors.append(str(exc))
    if errors:
        raise ApplyFailed("restore incomplete: " + "; ".join(errors))
    store.remove()
    lines = tuple(undo.lines())
    if not undo.complete:
        lines += (
            "no record of the cut: removed netcut's marks only; routes it deleted are not put back",
        )
    return lines

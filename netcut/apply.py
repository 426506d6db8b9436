"""The executor: one dispatcher that turns plan ops into netlink, sysctl and netfilter calls,
plus the jobs that run inside the namespace (nsexec.run_in_netns) for cut, status, restore.

Strategy. A cut writes its record (records.py) *before* the first change, then applies ops one
by one, remembering each that succeeded; when one fails, the inverses of the done ops run in
reverse order (best effort, each one tolerant) and ApplyFailed is raised, and the record is
removed only when the rollback itself completed. Restore ops are tolerant by design: putting
back a route that exists, or removing one that is gone, is not an error, so restore can finish
a rollback or a cut that was killed midway.
"""

from __future__ import annotations

import errno
import time
from dataclasses import dataclass
from typing import Any

from iptc import IPTCError
from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from netcut import backstop, flows, plan
from netcut.errors import ApplyFailed
from netcut.plan import (
    AddAddr,
    AddBackstop,
    AddRoute,
    CutPlan,
    CutStatus,
    DelAddr,
    DelRoute,
    Keep,
    KillFlows,
    NamespaceState,
    Op,
    RemoveBackstop,
    Route,
    SetSysctl,
)
from netcut.records import Store
from netcut.state import read_state

_GONE = (errno.ESRCH, errno.ENOENT, errno.EADDRNOTAVAIL, errno.ENODEV)


def apply_op(ipr: Any, op: Op, *, tolerant: bool = False) -> None:
    """Run one op. `tolerant`: an add of what exists or a delete of what is gone passes."""
    try:
        _dispatch(ipr, op)
    except NetlinkError as exc:
        if tolerant and (exc.code == errno.EEXIST or exc.code in _GONE):
            return
        raise ApplyFailed(f"{op}: {exc.args[-1] if exc.args else exc}") from None
    except OSError as exc:
        raise ApplyFailed(f"{op}: {exc.strerror or exc}") from None
    except IPTCError as exc:
        raise ApplyFailed(f"{op}: {exc}") from None


def _dispatch(ipr: Any, op: Op) -> None:
    if isinstance(op, AddRoute | DelRoute):
        ipr.route("add" if isinstance(op, AddRoute) else "del", **route_kwargs(op.route))
    elif isinstance(op, AddAddr | DelAddr):
        a = op.addr
        ipr.addr(
            "add" if isinstance(op, AddAddr) else "del",
            index=a.index,
            address=a.address,
            prefixlen=a.prefixlen,
            family=a.family,
            flags=a.flags,
        )
    elif isinstance(op, SetSysctl):
        with open(f"/proc/sys/{op.key}", "w") as f:
            f.write(op.value)
    elif isinstance(op, AddBackstop):
        backstop.install(op.family, op.rules)
    elif isinstance(op, RemoveBackstop):
        backstop.remove(op.family)
    elif isinstance(op, KillFlows):
        flows.kill_flows(op.allowed)
    else:
        raise RuntimeError(f"unexpected {op!r}")


def route_kwargs(route: Route) -> dict[str, Any]:
    kw: dict[str, Any] = {
        "family": route.family,
        "dst_len": route.dst_len,
        "table": route.table,
        "proto": route.proto,
        "scope": route.scope,
        "type": route.type,
        "tos": route.tos,
    }
    optional = {
        "dst": route.dst,
        "gateway": route.gateway,
        "oif": route.oif,
        "prefsrc": route.prefsrc,
        "priority": route.priority,
    }
    kw.update({k: v for k, v in optional.items() if v is not None})
    if route.flags:
        kw["flags"] = route.flags
    if route.pref is not None:
        kw["RTA_PREF"] = route.pref
    if route.metrics:
        kw["metrics"] = {"attrs": [list(m) for m in route.metrics]}
    return kw


def apply_plan(ipr: Any, ops: tuple[Op, ...]) -> None:
    """Apply `ops` in order; on a failure roll back what was done and raise ApplyFailed."""
    done: list[Op] = []
    for op in ops:
        try:
            apply_op(ipr, op)
        except ApplyFailed as exc:
            leftovers = rollback(ipr, done)
            note = f"; rollback incomplete: {'; '.join(leftovers)}" if leftovers else ""
            msg = f"cut failed at: {exc}; rolled back {len(done)} change(s){note}"
            raise ApplyFailed(msg) from None
        done.append(op)


def rollback(ipr: Any, done: list[Op]) -> list[str]:
    """Undo `done` in reverse order; return the errors of undo steps that failed."""
    errors = []
    for op in reversed(done):
        inverse = plan.invert(op)
        if inverse is None:
            continue
        try:
            apply_op(ipr, inverse, tolerant=True)
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


def job_apply(ops: tuple[Op, ...]) -> None:
    """Apply arbitrary ops with rollback (tests use it to inject a failure midway)."""
    with IPRoute() as ipr:
        apply_plan(ipr, ops)


def job_status(store: Store) -> JobResult:
    with IPRoute() as ipr:
        record = store.load()
        state = read_state(ipr)
        return JobResult(plan.judge_status(record, state), record)


def job_cut(
    store: Store,
    keeps: tuple[Keep, ...],
    nameservers: tuple[str, ...],
    dry_run: bool,
    meta: dict[str, str],
) -> JobResult:
    """Plan and (unless `dry_run`) apply a cut. An existing complete cut is left as it is; a
    partial one is restored first."""
    start = time.perf_counter()
    with IPRoute() as ipr:
        record = store.load()
        state = read_state(ipr, keeps, nameservers)
        status = plan.judge_status(record, state)
        if status.is_cut:
            return JobResult(status, record, changed=False)
        if status.state == "partial" and not dry_run:
            _restore(ipr, store, record, state)
            state = read_state(ipr, keeps, nameservers)
        cut = plan.plan_cut(state, keeps)
        if dry_run:
            return JobResult(status, cut, lines=tuple(cut.lines()))
        store.save(cut, meta)
        try:
            apply_plan(ipr, cut.ops)
        except ApplyFailed:
            store.remove()
            raise
        elapsed = (time.perf_counter() - start) * 1000
        return JobResult(CutStatus("cut", cut.keeps), cut, changed=True, elapsed_ms=elapsed)


def job_restore(store: Store) -> JobResult:
    start = time.perf_counter()
    with IPRoute() as ipr:
        record = store.load()
        state = read_state(ipr)
        before = plan.judge_status(record, state)
        if before.state == "not cut":
            store.remove()
            return JobResult(before)
        lines = _restore(ipr, store, record, state)
        after = plan.judge_status(None, read_state(ipr))
        elapsed = (time.perf_counter() - start) * 1000
        return JobResult(after, record, changed=True, lines=lines, elapsed_ms=elapsed)


def _restore(
    ipr: Any, store: Store, record: CutPlan | None, state: NamespaceState
) -> tuple[str, ...]:
    undo = plan.plan_restore(record, state)
    errors = []
    for op in undo.ops:
        try:
            apply_op(ipr, op, tolerant=True)
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

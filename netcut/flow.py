"""One cut algorithm for both modes: plan, record, apply, roll back, probe, restore, status.

Why one: direct mode (netcut's worker inside the namespace) and helper mode (a container that
shares the namespace) used to carry a copy each, and the copies drifted (records per mode, a
keep-mismatch check in one only). Now each mode is only an `Executor`, four primitives:
read the state, apply ops all-or-nothing, undo ops tolerantly, probe. Everything else is here,
so a cut made in one mode is seen, checked and restored by the other: records are keyed by the
namespace itself (records.py), never by mode or container (docs/netcut.md#one-algorithm).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

from netcut.errors import ApplyFailed, InvalidInput, ProbeFailed, UnsafeTarget
from netcut.plan import planner as plan_mod
from netcut.plan import verify
from netcut.plan.changes import AddBackstop, AddRedirect, Op
from netcut.plan.model import Keep, NamespaceState, ProbeResult
from netcut.plan.planner import CutPlan
from netcut.plan.status import CutStatus, judge_status
from netcut.plan.transparent import Redirect, redirect_rules
from netcut.records import Journal, Store


class Executor(Protocol):
    """What a mode must provide. Every method acts on the one namespace the executor names."""

    def read_state(
        self, keeps: tuple[Keep, ...], nameservers: tuple[str, ...], verify: bool = False
    ) -> NamespaceState:
        """With `verify` also what status compares (policy rules, the backstop's rules and
        hook: docs/netcut.md#status); a mode that cannot read them leaves them None."""

    def apply(self, ops: tuple[Op, ...]) -> None:
        """Apply in order; on a failure undo what was done and raise ApplyFailed
        (`rolled_back` False when the undo itself failed)."""

    def undo(self, ops: tuple[Op, ...]) -> list[str]:
        """Apply tolerantly, every op even after one failed (an add of what exists or a
        delete of what is gone passes): undo and repair. Return the errors."""

    def probe(
        self,
        reachable: tuple[Keep, ...],
        blocked: tuple[Keep, ...],
        timeout: float,
        resolvers: tuple[str, ...] = (),
        name: str = "",
    ) -> ProbeResult:
        """Connect to each target; with `resolvers`, also ask each one for `name` on port 53
        (each must stay silent)."""


@runtime_checkable
class Journaling(Protocol):
    """An executor that notes each op in the record's journal as it completes (direct mode:
    docs/netcut.md#the-journal). One that is not (helper mode) gets a record that stands
    for the whole plan, undone tolerantly."""

    def apply_journaled(self, ops: tuple[Op, ...], journal: Journal) -> None: ...


@runtime_checkable
class ReadsMarks(Protocol):
    """An executor that can read netcut's marks alone (`NamespaceState.marks()`: its routes,
    backstop and redirects), which is all a restore plans from and judges by (direct mode:
    docs/netcut.md#idempotency-status-restore). One that is not (helper mode) reads the
    whole state instead."""

    def read_marks(self) -> NamespaceState: ...


@runtime_checkable
class UndoesAndReadsMarks(Protocol):
    """An executor for which an undo and the read of the marks it left are one request
    (helper mode: each request is a round trip through the engine and a shell)."""

    def undo_and_read_marks(
        self, ops: tuple[Op, ...]
    ) -> tuple[list[str], NamespaceState | None]: ...


@runtime_checkable
class UndoesIfCut(Protocol):
    """An executor that can undo a recorded cut only if the namespace still holds the cut's
    first change, its backstop, and read the marks afterwards, in one request (helper mode).
    A restore from a complete record needs no read before the undo then: the backstop is
    the proof that the record is this namespace's (docs/netcut.md#idempotency-status-restore)."""

    def undo_if_cut(
        self, ops: tuple[Op, ...], family: int
    ) -> tuple[list[str], NamespaceState | None, bool]:
        """(the undo's errors, the marks afterwards (None when the undo failed), whether
        the undo ran). Without `family`'s backstop nothing is undone and the marks are the
        namespace's as they were."""


NO_MARKS = NamespaceState(links=(), addrs=(), routes=())


def _marks(ex: Executor) -> NamespaceState:
    if isinstance(ex, ReadsMarks):
        return ex.read_marks()
    return ex.read_state((), ()).marks()


@dataclass(frozen=True)
class CutResult:
    """What a cut did. `changed` is False when the namespace was already cut (then nothing
    was touched) or for a dry run; `probe` is None when probing was disabled."""

    target: str
    status: CutStatus
    plan: CutPlan | None
    changed: bool
    probe: ProbeResult | None = None
    elapsed_ms: float = 0.0
    dry_run: bool = False
    script: str | None = None  # helper mode: the shell script the plan renders to
    # A partial cut brought back to its recorded plan; `plan` holds the repair's ops and
    # `found` the differences that were repaired (docs/netcut.md#status).
    repaired: bool = False
    found: tuple[str, ...] = ()
    # the namespace's nsfs (st_dev, st_ino), which names its record: `netcut.forget` takes
    # it after the namespace is gone (both modes; None only when neither the helper nor
    # the host could tell it)
    identity: tuple[int, int] | None = None
    # which mode did the work ("direct" or "helper"), and why when it was chosen for the
    # caller (docs/netcut.md#modes-and-privileges)
    mode: str = "direct"
    mode_reason: str = ""

    @property
    def head(self) -> str:
        """The first word of the answer: dry-run, repaired, cut or already cut."""
        if self.dry_run:
            return "dry-run"
        if self.repaired:
            return "repaired"
        return "cut" if self.changed else "already cut"

    def lines(self) -> list[str]:
        if self.dry_run and self.plan is not None:
            head = "already cut:" if self.status.is_cut else "plan for"
            head = "repair plan for" if self.repaired else head
            shown = [f"{head} {self.target}", *self.plan.lines()]
            if self.script is not None:
                shown += ["helper script:", *(f"  {line}" for line in self.script.splitlines())]
            return shown
        out = [f"{self.head}: {self.target}"]
        if self.mode_reason:
            out.append(f"mode: {self.mode} ({self.mode_reason})")
        out += [f"  found: {line}" for line in self.found]
        if self.plan is not None and self.changed:
            out += self.plan.lines()
        if self.probe is not None:
            out += ["probe:", *(f"  {line}" for line in self.probe.lines())]
        return out


@dataclass(frozen=True)
class RestoreResult:
    target: str
    changed: bool  # False: the namespace was not cut
    status: CutStatus
    lines: tuple[str, ...] = ()
    elapsed_ms: float = 0.0


@dataclass(frozen=True)
class CutRequest:
    keeps: tuple[Keep, ...]
    nameservers: tuple[str, ...] = ()
    dry_run: bool = False
    meta: dict[str, str] | None = None
    probe: bool = True
    expect_blocked: tuple[Keep, ...] = ()
    probe_timeout: float = 1.0
    redirect: Redirect | None = None  # transparent mode (docs/netcut.md#transparent-mode)
    # probed as reachable besides the keeps with a port (loopback listeners: egress)
    expect_reachable: tuple[Keep, ...] = ()
    # resolvers the probe must find silent, asked for `query_name` (helper mode:
    # docs/netcut.md#the-resolvers-from-inside)
    resolvers: tuple[str, ...] = ()
    query_name: str = ""


def cut(
    ex: Executor, store: Store, label: str, req: CutRequest, render: RenderHook | None = None
) -> CutResult:
    """Cut (or find cut) the namespace, then probe it. An existing complete cut with the same
    keeps is left alone; with other keeps it is InvalidInput; a partial one with the same
    keeps is repaired to its recorded plan, any other partial one is undone first."""
    start = time.perf_counter()
    with store.locked():
        record = store.load()
        state = ex.read_state(req.keeps, req.nameservers, verify=record is not None)
        status = judge_status(record, state)
        same = record is not None and set(record.keeps) == set(req.keeps)
        if record is not None and verify.unrefused_resolvers(record.ops, state):
            # A resolver the recorded backstop does not refuse (a cut made before netcut
            # could see it): no repair of that plan closes it, a new plan does.
            same = False
        if status.state == "partial" and record is not None and same:
            result = _repair(ex, store, label, record, state, req, render=render, start=start)
        elif status.is_cut:
            if record is not None and set(record.keeps) != set(req.keeps) and not req.dry_run:
                had = ", ".join(str(k) for k in record.keeps) or "loopback only"
                raise InvalidInput(f"{label} is already cut keeping {had}; restore it first")
            if record is not None and not req.dry_run:
                _same_redirect(label, record, req.redirect)
            result = CutResult(label, status, record, False, dry_run=req.dry_run)
        else:
            if status.state == "partial" and record is None and not req.dry_run:
                # What the earlier cut deleted is known only to its record: planning from
                # here would record a namespace that has already lost its routes, and its
                # restore could never put them back (docs/netcut.md#the-journal).
                marks = "; ".join(status.details[1:])
                raise UnsafeTarget(
                    f"refusing to cut {label}: it carries netcut's marks ({marks}) but has no "
                    "record, so the routes an earlier cut deleted cannot be known; `netcut "
                    "restore` removes the marks, then put its routes back and cut again"
                )
            if status.state == "partial" and not req.dry_run:
                _restore(ex, store, record, state, check=False)
                state = ex.read_state(req.keeps, req.nameservers)
            if state.dns_unverified and not req.dry_run:
                # fail closed: a cut whose DNS cannot be verified would never be `cut`
                raise ApplyFailed(
                    f"{label}: its DNS cannot be verified ({'; '.join(state.dns_unverified)});"
                    " nothing was changed"
                )
            planned = plan_mod.plan_cut(state, req.keeps, req.redirect)
            if req.dry_run:
                script = render(planned.ops) if render else None
                return CutResult(label, status, planned, False, dry_run=True, script=script)
            _apply_recorded(ex, store, planned, req.meta or {"target": label})
            elapsed = (time.perf_counter() - start) * 1000
            result = CutResult(
                label, CutStatus("cut", planned.keeps), planned, True, elapsed_ms=elapsed
            )
    if req.dry_run:
        return result
    return _probed(ex, label, result, req)


def _apply_recorded(ex: Executor, store: Store, planned: CutPlan, meta: dict[str, str]) -> None:
    """Record the plan, then apply it: as a journal (each op noted as it completes) when the
    executor can, else as a whole. The record is removed only when the rollback of a failed
    apply completed; a worker that died or went silent is no rollback (ApplyFailed with
    `rolled_back` False), and its record lets `restore` undo exactly what ran."""
    journaling = isinstance(ex, Journaling)
    store.save(planned, meta, journal=journaling)
    try:
        if isinstance(ex, Journaling):
            with store.journal() as journal:
                ex.apply_journaled(planned.ops, journal)
        else:
            ex.apply(planned.ops)
    except ApplyFailed as exc:
        if exc.rolled_back:
            store.remove()  # else keep it: `restore` finishes what the rollback could not
        raise


def _same_redirect(label: str, record: CutPlan, redirect: Redirect | None) -> None:
    """A cut namespace is never re-cut with other redirects (that would open it in between):
    transparent or not, and to which ports, must match the record."""
    had = next((op.rules for op in record.ops if isinstance(op, AddRedirect)), None)
    want = None if redirect is None else redirect_rules(redirect, record.keeps)
    if had != want:
        how = "transparently" if had is not None else "without transparent mode"
        raise InvalidInput(f"{label} is already cut {how}, differently; restore it first")


class RenderHook(Protocol):
    def __call__(self, ops: tuple[Op, ...]) -> str: ...


def _repair(
    ex: Executor,
    store: Store,
    label: str,
    record: CutPlan,
    state: NamespaceState,
    req: CutRequest,
    *,
    render: RenderHook | None,
    start: float,
) -> CutResult:
    """Bring a tampered cut back to its recorded plan (docs/netcut.md#status). The record is
    kept as it is, so a later restore puts back the state from before the cut, never what
    was added meanwhile. No rollback: every step closes the namespace further, so a failed
    step is reported (ApplyFailed, not rolled back) and the rest still runs."""
    ops = verify.repair_ops(record.ops, state)
    fix = CutPlan(record.keeps, ops, record.nameservers)
    before = judge_status(record, state)
    if req.dry_run:
        script = render(ops) if render else None
        return CutResult(label, before, fix, False, dry_run=True, script=script, repaired=True)
    errors = ex.undo(ops)
    after = judge_status(record, ex.read_state((), (), verify=True))
    if errors or not after.is_cut:
        left = "; ".join([*errors, *after.details])
        raise ApplyFailed(f"repair of the partial cut incomplete: {left}", rolled_back=False)
    if record.applied is not None and record.applied < len(record.ops):
        # An interrupted cut, now completed: its journal must say every op ran, so that
        # restore undoes them all.
        with store.journal() as journal:
            for index in range(record.applied, len(record.ops)):
                journal.step(index)
    elapsed = (time.perf_counter() - start) * 1000
    return CutResult(
        label, after, fix, True, elapsed_ms=elapsed, repaired=True, found=before.details
    )


def _probed(ex: Executor, label: str, result: CutResult, req: CutRequest) -> CutResult:
    keeps = (k for k in req.keeps if k.port is not None)
    reachable = tuple(dict.fromkeys((*keeps, *req.expect_reachable)))
    # with transparent mode's DNS responder every query is the proxy's to answer
    answered_by_proxy = req.redirect is not None and req.redirect.dns_port is not None
    resolvers = () if answered_by_proxy else req.resolvers
    if not req.probe or not (reachable or req.expect_blocked or resolvers):
        return result
    if resolvers:
        found = ex.probe(
            reachable, req.expect_blocked, req.probe_timeout, resolvers, req.query_name
        )
    else:
        found = ex.probe(reachable, req.expect_blocked, req.probe_timeout)
    if not found.ok:
        raise ProbeFailed(f"{label} is cut but the probe failed: {found.reason()}", found)
    return replace(result, probe=found)


def restore(ex: Executor, store: Store, label: str) -> RestoreResult:
    """Undo a cut exactly; a namespace that is not cut is left alone (changed False)."""
    start = time.perf_counter()
    with store.locked():
        record = store.load()
        done, state = _restore_recorded(ex, store, record)
        if done is not None:
            elapsed = (time.perf_counter() - start) * 1000
            return RestoreResult(label, True, judge_status(None, done[1]), done[0], elapsed)
        # Netcut's marks are all a restore needs: whether the namespace is "not cut" (no
        # mark: judge_status) and what to undo (plan_restore) depend on nothing else, and
        # the check afterwards is that no mark is left (tests/unit/test_netcut_marks.py).
        state = _marks(ex) if state is None else state
        before = judge_status(record, state)
        if before.state == "not cut":
            store.remove()
            return RestoreResult(label, False, before)
        lines, left = _restore(ex, store, record, state)
        after = judge_status(None, _marks(ex) if left is None else left)
        elapsed = (time.perf_counter() - start) * 1000
        return RestoreResult(label, True, after, lines, elapsed)


def _restore_recorded(
    ex: Executor, store: Store, record: CutPlan | None
) -> tuple[tuple[tuple[str, ...], NamespaceState] | None, NamespaceState | None]:
    """A complete record's undo, run only if the namespace holds the backstop the cut
    installed first, then netcut's marks read: one request where an executor can
    (`UndoesIfCut`), so a restore reads nothing before it undoes. Marks the record does
    not hold (an earlier cut's, unrecorded) are removed by a second pass. ((the lines, the
    marks left) or None, and the marks as they were when the undo did not run or None)."""
    first = record.ops[0] if record is not None and record.ops else None
    if not isinstance(ex, UndoesIfCut) or record is None or record.applied is not None:
        return None, None
    if not isinstance(first, AddBackstop):
        return None, None
    undo = plan_mod.plan_restore(record, NO_MARKS)
    errors, left, undone = ex.undo_if_cut(undo.ops, first.family)
    if not undone:
        return None, left
    _raise_unless_undone(errors)
    assert left is not None  # (None only with errors)
    lines = tuple(undo.lines())
    if left.marked_routes or left.backstop or left.redirect:
        extra = plan_mod.plan_restore(None, left)
        after = _undo(ex, extra.ops, check=True)
        lines, left = lines + tuple(extra.lines()), _marks(ex) if after is None else after
    store.remove()
    return (lines, left), None


def _undo(ex: Executor, ops: tuple[Op, ...], *, check: bool) -> NamespaceState | None:
    """Undo `ops` tolerantly; with `check`, the marks left when the executor reads them
    with the undo (`UndoesAndReadsMarks`), else None. ApplyFailed if anything failed."""
    left: NamespaceState | None = None
    if check and isinstance(ex, UndoesAndReadsMarks):
        errors, left = ex.undo_and_read_marks(ops)
    else:
        errors = ex.undo(ops)
    _raise_unless_undone(errors)
    return left


def _raise_unless_undone(errors: list[str]) -> None:
    if errors:
        raise ApplyFailed("restore incomplete: " + "; ".join(errors))


def status(ex: Executor, store: Store, nameservers: tuple[str, ...] = ()) -> CutStatus:
    """The whole live state against the record; `nameservers`, the namespace's resolvers as
    the caller read them, must be refused too (docs/netcut.md#the-resolvers-from-inside)."""
    return judge_status(store.load(), ex.read_state((), nameservers, verify=True))


def cut_and_status(
    ex: Executor, store: Store, label: str, req: CutRequest
) -> tuple[CutResult, CutStatus]:
    """`cut` (with its probe), then `status`: what egress's prepare_execution proves, in one
    job. A fresh cut is verified from the live state read afresh against the plan it holds
    in memory; a cut that found the namespace cut, or repaired it, has just judged the
    whole live state against the record (verify=True) and that status is the answer, not
    read a second time."""
    result = cut(ex, store, label, req)
    if not (result.changed and not result.repaired and result.plan is not None):
        return result, result.status
    return result, judge_status(result.plan, ex.read_state((), (), verify=True))


def _restore(
    ex: Executor,
    store: Store,
    record: CutPlan | None,
    state: NamespaceState,
    *,
    check: bool = True,
) -> tuple[tuple[str, ...], NamespaceState | None]:
    """Undo the cut and drop its record: the lines that say what was undone, and, with
    `check`, the marks left afterwards when the executor read them with the undo (else
    None). A cut's repair reads the whole state next anyway, so it asks for no check."""
    undo = plan_mod.plan_restore(record, state)
    left = _undo(ex, undo.ops, check=check)
    store.remove()
    lines = tuple(undo.lines())
    if not undo.complete:
        lines += (
            "no record of the cut: removed netcut's marks only; routes it deleted are not put back",
        )
    return lines, left

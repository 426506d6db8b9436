"""The executor: one dispatcher that turns plan ops into netlink, sysctl and netfilter calls
(the latter through the netfilter backend, netfilter.py),
plus the jobs that run inside the namespace (worker.run_in_netns): direct mode's executor
primitives for the one cut algorithm in flow.py.

Strategy. A cut writes its record (records.py) *before* the first change, then applies ops one
by one, noting each that succeeded in the record's journal; when one fails, the inverses of
the done ops run in reverse order (best effort, each one tolerant) and ApplyFailed is raised;
the record is removed only when the rollback itself completed, else it stays for `restore`.
Restore ops are tolerant by design: putting back a route that exists, or removing one that is
gone, is not an error, so restore can finish a rollback or a cut that was killed midway.

The jobs at the end run a whole operation (flow.py's cut with its probe and status, restore,
status) inside the namespace with `InNamespace`, so a cut is one round trip to the worker.

`NETCUT_FAULT_KILL_AFTER_OP=N` (read when a worker starts; for fault-injection tests only)
makes the worker SIGKILL itself right after op N of a cut is journaled: a kill at that step
boundary (docs/netcut.md#the-journal).
"""

from __future__ import annotations

import errno
import os
import signal

from netcut import flow
from netcut.collect import collect_if_due
from netcut.direct import sockdestroy
from netcut.direct.kernelstate import SysctlWriter, read_marks, read_state
from netcut.direct.probe import run_probe
from netcut.direct.rtnl import MalformedMessage, NetlinkError, Rtnl
from netcut.direct.shellface import in_namespace
from netcut.errors import ApplyFailed, StateError
from netcut.netfilter import Netfilter, backend
from netcut.plan import planner
from netcut.plan.changes import (
    AddAddr,
    AddBackstop,
    AddRedirect,
    AddRoute,
    DelAddr,
    DelRoute,
    KillFlows,
    Op,
    RemoveBackstop,
    RemoveRedirect,
    SetSysctl,
)
from netcut.plan.model import Keep, NamespaceState, ProbeResult
from netcut.plan.status import CutStatus
from netcut.records import Journal, Store

FAULT_ENV = "NETCUT_FAULT_KILL_AFTER_OP"
_kill_after = int(os.environ.get(FAULT_ENV, "-1") or -1)

_GONE = (errno.ESRCH, errno.ENOENT, errno.EADDRNOTAVAIL, errno.ENODEV)

# The netfilter backend (netfilter.py chooses it), as direct mode drives it in the namespace.
NETFILTER: Netfilter = in_namespace(backend())


def apply_op(
    rt: Rtnl, op: Op, *, tolerant: bool = False, sysctls: SysctlWriter | None = None
) -> None:
    """Run one op. `tolerant`: an add of what exists or a delete of what is gone passes.
    `sysctls`: the writer of the ops around it (one opened here otherwise)."""
    try:
        if sysctls is None:
            with SysctlWriter() as own:
                _dispatch(rt, op, own)
        else:
            _dispatch(rt, op, sysctls)
    except NetlinkError as exc:
        if tolerant and (exc.code == errno.EEXIST or exc.code in _GONE):
            return
        raise ApplyFailed(f"{op}: {exc.args[-1] if exc.args else exc}") from None
    except MalformedMessage as exc:
        raise ApplyFailed(f"{op}: the kernel's answer did not parse: {exc}") from None
    except OSError as exc:
        raise ApplyFailed(f"{op}: {exc.strerror or exc}") from None
    except NETFILTER.errors as exc:
        raise ApplyFailed(f"{op}: {exc}") from None


def _dispatch(rt: Rtnl, op: Op, sysctls: SysctlWriter) -> None:
    if isinstance(op, AddRoute | DelRoute):
        rt.route(isinstance(op, AddRoute), op.route)
    elif isinstance(op, AddAddr | DelAddr):
        rt.addr(isinstance(op, AddAddr), op.addr)
    elif isinstance(op, SetSysctl):
        sysctls.write(op.key, op.value)
    elif isinstance(op, AddBackstop):
        NETFILTER.install_backstop(op.family, op.rules)
    elif isinstance(op, RemoveBackstop):
        NETFILTER.remove_backstop(op.family)
    elif isinstance(op, KillFlows):
        sockdestroy.kill_flows(op.allowed)
    elif isinstance(op, AddRedirect):
        NETFILTER.install_redirects(op.rules)
    elif isinstance(op, RemoveRedirect):
        NETFILTER.remove_redirects()
    else:
        raise RuntimeError(f"unexpected {op!r}")


def apply_plan(rt: Rtnl, ops: tuple[Op, ...], journal: Journal | None = None) -> None:
    """Apply `ops` in order, noting each in `journal` once done; on a failure (of an op, or
    of the journal: a cut that cannot be recorded does not go on) roll back what was done
    and raise ApplyFailed."""
    done: list[Op] = []
    with SysctlWriter() as sysctls:
        for index, op in enumerate(ops):
            try:
                apply_op(rt, op, sysctls=sysctls)
                done.append(op)
                if journal is not None:
                    journal.step(index)
            except (ApplyFailed, StateError) as exc:
                leftovers = rollback(rt, done)
                note = f"; rollback incomplete: {'; '.join(leftovers)}" if leftovers else ""
                msg = f"cut failed at: {exc}; rolled back {len(done)} change(s){note}"
                raise ApplyFailed(msg, rolled_back=not leftovers) from None
            if index == _kill_after:
                os.kill(os.getpid(), signal.SIGKILL)


def rollback(rt: Rtnl, done: list[Op]) -> list[str]:
    """Undo `done` in reverse order; return the errors of undo steps that failed."""
    errors = []
    with SysctlWriter() as sysctls:
        for op in reversed(done):
            inverse = planner.invert(op)
            if inverse is None:
                continue
            try:
                apply_op(rt, inverse, tolerant=True, sysctls=sysctls)
            except ApplyFailed as exc:
                errors.append(str(exc))
    return errors


def undo_ops(rt: Rtnl, ops: tuple[Op, ...]) -> list[str]:
    """Apply ops tolerantly, each one even when another failed; return the errors."""
    errors = []
    with SysctlWriter() as sysctls:
        for op in ops:
            try:
                apply_op(rt, op, tolerant=True, sysctls=sysctls)
            except ApplyFailed as exc:
                errors.append(str(exc))
    return errors


class InNamespace:
    """Direct mode's executor (flow.Executor, flow.Journaling): the kernel calls themselves,
    made by netcut's worker after it entered the namespace (direct/worker.py). One netlink socket
    for the whole job."""

    def __init__(self) -> None:
        self.rt = Rtnl()

    def close(self) -> None:
        self.rt.close()

    def __enter__(self) -> InNamespace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read_state(
        self, keeps: tuple[Keep, ...], nameservers: tuple[str, ...], verify: bool = False
    ) -> NamespaceState:
        return read_state(self.rt, NETFILTER, keeps, nameservers, verify=verify)

    def read_marks(self) -> NamespaceState:
        return read_marks(self.rt, NETFILTER)

    def apply(self, ops: tuple[Op, ...]) -> None:
        apply_plan(self.rt, ops)

    def apply_journaled(self, ops: tuple[Op, ...], journal: Journal) -> None:
        apply_plan(self.rt, ops, journal)

    def undo(self, ops: tuple[Op, ...]) -> list[str]:
        return undo_ops(self.rt, ops)

    def probe(
        self,
        reachable: tuple[Keep, ...],
        blocked: tuple[Keep, ...],
        timeout: float,
        resolvers: tuple[str, ...] = (),
        name: str = "",
    ) -> ProbeResult:
        """Direct mode reads the resolvers itself (root reads the container's resolv.conf)
        and asks none of them: `resolvers` is helper mode's (CutRequest.resolvers)."""
        del resolvers, name
        return run_probe(reachable, blocked, timeout)


# ---------------------------------------------------------------- jobs run inside the namespace


def job_cut(store: Store, label: str, req: flow.CutRequest) -> flow.CutResult:
    """flow.cut with its probe, in one job; then, now and then, dead records collected."""
    with InNamespace() as ex:
        result = flow.cut(ex, store, label, req)
    if not req.dry_run:
        collect_if_due(store.directory)
    return result


def job_cut_and_status(
    store: Store, label: str, req: flow.CutRequest
) -> tuple[flow.CutResult, CutStatus]:
    """flow.cut_and_status in one job (egress's prepare_execution)."""
    with InNamespace() as ex:
        found = flow.cut_and_status(ex, store, label, req)
    collect_if_due(store.directory)
    return found


def job_restore(store: Store, label: str) -> flow.RestoreResult:
    with InNamespace() as ex:
        return flow.restore(ex, store, label)


def job_status(store: Store, nameservers: tuple[str, ...] = ()) -> CutStatus:
    with InNamespace() as ex:
        return flow.status(ex, store, nameservers)


def job_read_state(
    keeps: tuple[Keep, ...], nameservers: tuple[str, ...], verify: bool = False
) -> NamespaceState:
    """The namespace's state (tests and benchmarks read it through the worker)."""
    with Rtnl() as rt:
        return read_state(rt, NETFILTER, keeps, nameservers, verify=verify)


def job_read_marks() -> NamespaceState:
    """The namespace's marks as a restore reads them (tests compare them with read_state's)."""
    with Rtnl() as rt:
        return read_marks(rt, NETFILTER)


def job_apply(ops: tuple[Op, ...]) -> None:
    """Apply ops in order with rollback, without a record (tests: a failure midway)."""
    with Rtnl() as rt:
        apply_plan(rt, ops)

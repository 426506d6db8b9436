"""The executor: one dispatcher that turns plan ops into netlink, sysctl and netfilter calls,
plus the jobs that run inside the namespace (nsexec.run_in_netns): direct mode's executor
primitives for the one cut algorithm in flow.py.

Strategy. A cut writes its record (records.py) *before* the first change, then applies ops one
by one, remembering each that succeeded; when one fails, the inverses of the done ops run in
reverse order (best effort, each one tolerant) and ApplyFailed is raised; the record is
removed only when the rollback itself completed, else it stays for `restore`. Restore ops are
tolerant by design: putting back a route that exists, or removing one that is gone, is not an
error, so restore can finish a rollback or a cut that was killed midway.
"""

from __future__ import annotations

import errno

from iptc import IPTCError

from netcut import backstop, flows, nat, plan
from netcut.errors import ApplyFailed
from netcut.model import Keep, NamespaceState
from netcut.ops import (
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


def job_read_state(
    keeps: tuple[Keep, ...], nameservers: tuple[str, ...], verify: bool = False
) -> NamespaceState:
    """The namespace's state (flow.Executor.read_state, direct mode)."""
    with Rtnl() as rt:
        return read_state(rt, keeps, nameservers, verify=verify)


def job_apply(ops: tuple[Op, ...]) -> None:
    """Apply ops in order with rollback (flow.Executor.apply, direct mode)."""
    with Rtnl() as rt:
        apply_plan(rt, ops)


def job_undo(ops: tuple[Op, ...]) -> list[str]:
    """Apply ops tolerantly, each one even when another failed; return the errors."""
    errors = []
    with Rtnl() as rt:
        for op in ops:
            try:
                apply_op(rt, op, tolerant=True)
            except ApplyFailed as exc:
                errors.append(str(exc))
    return errors

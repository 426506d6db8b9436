"""The cut and its proof: netcut's cut, probe and status, in one job of netcut's worker in
direct mode or one helper run in helper mode (docs/netcut.md#helper-mode); anything short of
a probed `cut` is `ExecutionNotReady` (fail closed)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from netcut.targetref import parse_target

if TYPE_CHECKING:
    from .passing import HelperCut

from .execution import (
    CutMode,
    ExecutionNotReady,
    not_ready_kind,
)


async def cut_and_prove(
    sandbox: str,
    keeps: Sequence[str],
    reachable: Sequence[str],
    blocked: Iterable[str],
    *,
    force: bool,
    allow_privileged: bool,
    redirect: tuple[int, int] | None = None,
    cut_mode: CutMode = "direct",
    helper_image: str | None = None,
    run: HelperCut | None = None,
) -> tuple[Any, Any]:
    """Cut `sandbox` keeping `keeps`, probe (`reachable` must answer from inside, `blocked`
    must not) and read its status; (cut, probe) only when all of that holds. `run`: the helper
    run that opened the sandbox's listeners, which cuts it too (passing.py)."""
    import netcut
    from netcut.plan.transparent import Redirect

    try:
        if run is not None:
            cut, probe, status = await run.cut_and_status(reachable, list(blocked), redirect)
        elif cut_mode == "helper":
            cut, probe, status = await _helper_cut(
                sandbox, keeps, reachable, list(blocked), allow_privileged, helper_image
            )
        else:
            # one round trip to netcut's worker: cut, probe and status in one job
            cut, status = await netcut.cut_and_status_async(
                sandbox,
                keeps,
                expect_reachable=list(reachable),
                expect_blocked=list(blocked),
                force=force,
                allow_privileged=allow_privileged,
                redirect=Redirect(*redirect) if redirect is not None else None,
            )
            probe = cut.probe
    except netcut.NetcutError as exc:
        raise ExecutionNotReady(f"sandbox {sandbox}: {exc}", not_ready_kind(exc)) from exc
    if probe is None or not probe.ok:
        why = probe.reason() if probe is not None else "nothing was probed"
        raise ExecutionNotReady(f"sandbox {sandbox}: probe failed: {why}", "probe_failed")
    if not _is_cut(status):
        raise ExecutionNotReady(f"sandbox {sandbox}: status after the cut is {status}", "not_cut")
    return cut, probe


async def _helper_cut(
    sandbox: str,
    keeps: Sequence[str],
    reachable: Sequence[str],
    blocked: list[str],
    allow_privileged: bool,
    image: str | None,
) -> tuple[Any, Any, Any]:
    """Cut, probe and status in one helper run (docs/netcut.md#helper-mode): the probe runs
    from inside the namespace and checks every kept ADDR:PORT (in gateway mode exactly the
    listeners) and every `blocked` one; the status then reads the whole live state, as
    direct mode's does."""
    from netcut.helper import mode as helper

    assert set(reachable) <= set(keeps), "helper mode probes what it keeps (gateway mode)"
    cut, status = await asyncio.to_thread(
        functools.partial(
            helper.cut_and_status,
            parse_target(sandbox),
            tuple(keeps),
            image=image,
            expect_blocked=tuple(blocked),
            allow_privileged=allow_privileged,
        )
    )
    return cut, cut.probe, status


def _is_cut(status: Any) -> bool:
    return bool(getattr(status, "is_cut", False))

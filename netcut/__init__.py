"""netcut: cut a network namespace down to loopback and a few kept addresses.

    from netcut import cut, probe, restore, status
    result = cut("/proc/1234/ns/net", keep=["198.19.0.1:8080"])   # probes; raises on failure

See docs/netcut.md for the plan, the modes and what a cut does and does not protect against.

The errors and target references are imported at once; the operations (which load pyroute2
and python-iptables, ~0.7 s) on first use, so that `egress` can share the target parser
(`netcut.targetref`) without paying for them (docs/architecture.md#netcut-who-owns-what).
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _package_version
from typing import TYPE_CHECKING, Any

from netcut.errors import (
    ApplyFailed,
    InvalidInput,
    NetcutError,
    PrivilegeError,
    ProbeFailed,
    StateError,
    TargetNotFound,
    UnsafeTarget,
)
from netcut.targetref import TargetRef, container, netns, netns_path, parse_target, pid

if TYPE_CHECKING:
    from netcut.api import (
        CutResult,
        RestoreResult,
        cut,
        cut_and_status,
        cut_and_status_async,
        cut_async,
        forget,
        gc,
        probe,
        probe_async,
        restore,
        restore_async,
        status,
        status_async,
    )
    from netcut.direct.worker import start_worker
    from netcut.modes import ModeChoice, choose_mode
    from netcut.plan.model import Keep, ProbeItem, ProbeResult, parse_keep
    from netcut.plan.planner import CutPlan
    from netcut.plan.status import CutStatus

_LAZY = {
    **dict.fromkeys(
        (
            "CutResult",
            "RestoreResult",
            "cut",
            "cut_and_status",
            "cut_and_status_async",
            "cut_async",
            "forget",
            "gc",
            "probe",
            "probe_async",
            "restore",
            "restore_async",
            "status",
            "status_async",
        ),
        "netcut.api",
    ),
    "Keep": "netcut.plan.model",
    "parse_keep": "netcut.plan.model",
    "start_worker": "netcut.direct.worker",
    "ModeChoice": "netcut.modes",
    "choose_mode": "netcut.modes",
    "CutPlan": "netcut.plan.planner",
    "CutStatus": "netcut.plan.status",
    "ProbeItem": "netcut.plan.model",
    "ProbeResult": "netcut.plan.model",
}


def __getattr__(name: str) -> Any:
    """Import an operation's module on first use (PEP 562), and bind all it exports."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'netcut' has no attribute {name!r}")
    loaded = importlib.import_module(module)
    value = getattr(loaded, name)  # AttributeError while `module` itself is still loading
    for other, where in _LAZY.items():
        if where == module:
            globals()[other] = getattr(loaded, other)
    return value


try:  # the installed distribution's version (`netcut --version`, docs/cli.md)
    __version__ = _package_version("egress-netcut")
except PackageNotFoundError:  # pragma: no cover - a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "ApplyFailed",
    "CutPlan",
    "CutResult",
    "CutStatus",
    "InvalidInput",
    "Keep",
    "ModeChoice",
    "NetcutError",
    "PrivilegeError",
    "ProbeFailed",
    "ProbeItem",
    "ProbeResult",
    "RestoreResult",
    "StateError",
    "TargetNotFound",
    "TargetRef",
    "UnsafeTarget",
    "choose_mode",
    "container",
    "cut",
    "cut_and_status",
    "cut_and_status_async",
    "cut_async",
    "forget",
    "gc",
    "netns",
    "netns_path",
    "parse_keep",
    "parse_target",
    "pid",
    "probe",
    "probe_async",
    "restore",
    "restore_async",
    "start_worker",
    "status",
    "status_async",
]

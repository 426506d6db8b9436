"""netcut: cut a network namespace down to loopback and a few kept addresses.

    from netcut import cut, probe, restore, status
    result = cut("/proc/1234/ns/net", keep=["198.19.0.1:8080"])   # probes; raises on failure

See docs/netcut.md for the plan, the modes and what a cut does and does not protect against.
"""

from netcut.api import (
    CutResult,
    RestoreResult,
    cut,
    cut_async,
    probe,
    probe_async,
    restore,
    restore_async,
    status,
    status_async,
)
from netcut.errors import (
    ApplyFailed,
    InvalidInput,
    NetcutError,
    PrivilegeError,
    ProbeFailed,
    TargetNotFound,
    UnsafeTarget,
)
from netcut.model import Keep, parse_keep
from netcut.nsexec import start_worker
from netcut.plan import CutPlan, CutStatus
from netcut.probe import ProbeItem, ProbeResult
from netcut.target import TargetRef, container, netns, netns_path, pid

__all__ = [
    "ApplyFailed",
    "CutPlan",
    "CutResult",
    "CutStatus",
    "InvalidInput",
    "Keep",
    "NetcutError",
    "PrivilegeError",
    "ProbeFailed",
    "ProbeItem",
    "ProbeResult",
    "RestoreResult",
    "TargetNotFound",
    "TargetRef",
    "UnsafeTarget",
    "container",
    "cut",
    "cut_async",
    "netns",
    "netns_path",
    "parse_keep",
    "pid",
    "probe",
    "probe_async",
    "restore",
    "restore_async",
    "start_worker",
    "status",
    "status_async",
]

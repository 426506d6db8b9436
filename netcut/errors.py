"""The few error types a caller of `netcut` branches on.

Each carries the CLI exit code it maps to: 1 when a check failed (a probe, or a cut that could
not be applied and was rolled back), 2 for bad input (a target that does not exist, a refused
target, a missing privilege or runtime, a malformed keep entry).
"""

from __future__ import annotations


class NetcutError(Exception):
    """Base class of every error raised by `netcut`; the message names the culprit."""

    exit_code = 2


class InvalidInput(NetcutError):
    """A malformed argument (keep entry, target reference, probe target)."""


class InvalidType(InvalidInput, TypeError):
    """An argument of the wrong type (the string "false" for a flag, one string for a list);
    a TypeError too, like egress's (docs/policy.md#types)."""


class InvalidValue(InvalidInput, ValueError):
    """An argument of the right type out of range (a nan or negative timeout)."""


class TargetNotFound(NetcutError):
    """The namespace, process, container or container runtime does not exist."""


class PrivilegeError(NetcutError):
    """The caller lacks a privilege the operation needs (root, CAP_NET_ADMIN, CAP_SYS_ADMIN)."""


class UnsafeTarget(NetcutError):
    """Refused: the target is the caller's own or the host's namespace, or a process in it
    holds a capability that could undo the cut (`findings` lists them)."""

    def __init__(self, message: str, findings: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.findings = findings

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (str(self), self.findings))


class StateError(NetcutError):
    """netcut's record directory ($NETCUT_STATE_DIR) cannot be written or read: read-only,
    full, or missing permissions. Nothing in the namespace was changed (a cut writes its
    record before its first change; a restore takes the record's lock before its first)."""


class ApplyFailed(NetcutError):
    """A change could not be applied; what was done before it has been rolled back, unless
    `rolled_back` is False (then `netcut restore` finishes the job from the record)."""

    exit_code = 1

    def __init__(self, message: str, rolled_back: bool = True) -> None:
        super().__init__(message)
        self.rolled_back = rolled_back

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (str(self), self.rolled_back))


class ProbeFailed(NetcutError):
    """A probe found a kept address unreachable or an expected-blocked one reachable.

    `probe` is the ProbeResult (None when unknown); the namespace stays cut."""

    exit_code = 1

    def __init__(self, message: str, probe: object = None) -> None:
        super().__init__(message)
        self.probe = probe

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (str(self), self.probe))

"""Which mode does an operation: direct or helper, chosen for the caller unless it asks
(docs/netcut.md#modes-and-privileges).

Most people who cut a sandbox run as a normal user in the engine's group, never as root: the
eval process holds model API keys and runs untrusted task code around it. So a caller that
cannot enter a namespace (no CAP_SYS_ADMIN + CAP_NET_ADMIN) cuts a container through a helper
container, and is told so; root, or a process holding both, cuts directly (faster: no
container start). A target that is not a container cannot have a helper, and without the
privileges is a PrivilegeError that names the fix.
"""

from __future__ import annotations

from dataclasses import dataclass

from netcut.errors import InvalidInput, PrivilegeError
from netcut.resolve import ResolvedTarget, TargetRef, as_ref
from netcut.safety import CAP_NET_ADMIN, CAP_SYS_ADMIN, own_effective_caps

MODES = ("direct", "helper")
# what `direct` needs: setns(2) into another namespace and changing its network
_DIRECT_CAPS = {CAP_SYS_ADMIN: "CAP_SYS_ADMIN", CAP_NET_ADMIN: "CAP_NET_ADMIN"}


@dataclass(frozen=True)
class ModeChoice:
    """The mode an operation runs in, and why (said in the CLI's output, `--json` and
    `CutResult.mode_reason`)."""

    mode: str  # "direct" or "helper"
    reason: str

    def line(self) -> str:
        return f"mode: {self.mode} ({self.reason})"


def missing_direct_caps(mask: int) -> tuple[str, ...]:
    """The capabilities direct mode needs that the effective set `mask` lacks."""
    return tuple(name for bit, name in _DIRECT_CAPS.items() if not mask >> bit & 1)


def choose_mode(
    target: TargetRef | ResolvedTarget | str | int, asked: str | None = None
) -> ModeChoice:
    """`asked` ("direct", "helper") as given; else direct when this process holds the
    privileges for it, else helper for a container target. Raises PrivilegeError for a
    target only direct mode can reach without them, InvalidInput for an unknown mode."""
    return decide(target, asked, own_effective_caps())


def decide(
    target: TargetRef | ResolvedTarget | str | int, asked: str | None, mask: int
) -> ModeChoice:
    """`choose_mode` for a process whose effective capability set is `mask`."""
    if asked is not None and asked != "auto":
        if asked not in MODES:
            raise InvalidInput(f"mode {asked!r}: give direct or helper (or leave it out)")
        return ModeChoice(asked, "asked for")
    missing = missing_direct_caps(mask)
    if not missing:
        return ModeChoice("direct", "chosen: this process may enter the namespace")
    ref = as_ref(target)
    lacks = " + ".join(missing)
    if ref.kind == "container":
        return ModeChoice(
            "helper", f"chosen: this process lacks {lacks}, so a helper container cuts"
        )
    raise PrivilegeError(
        f"{ref}: entering a network namespace needs root or CAP_SYS_ADMIN + CAP_NET_ADMIN"
        f" (missing: {lacks}); run netcut as root, or name a docker or podman container"
        " (--container ID) and a helper container does it without root"
    )

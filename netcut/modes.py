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
from netcut.resolve import HELPER_RUNTIMES, ResolvedTarget, TargetRef, as_ref
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
    target: TargetRef | ResolvedTarget | str | int,
    asked: str | None,
    mask: int,
    *,
    helper_runtimes: tuple[str, ...] = HELPER_RUNTIMES,
    asked_as: str | None = None,
    strict: bool = True,
) -> ModeChoice:
    """`choose_mode` for a process whose effective capability set is `mask`.

    The boundary (egress, docs/user-guide.md#helper-mode) asks the same question with its own
    words: `helper_runtimes` are the engines whose helper does everything it needs (its
    listeners too: docker and podman), `asked_as` names its option in the reason
    ("cut_mode='helper' was asked for"), and `strict=False` answers direct mode for a target
    with no helper instead of raising, so that the preparation fails closed naming the mode
    and why (a namespace sandbox without root)."""
    if asked is not None and asked != "auto":
        if asked not in MODES:
            raise InvalidInput(f"mode {asked!r}: give direct or helper (or leave it out)")
        said = "asked for" if asked_as is None else f"{asked_as}={asked!r} was asked for"
        return ModeChoice(asked, said)
    missing = missing_direct_caps(mask)
    if not missing:
        return ModeChoice(
            "direct",
            "chosen: this process holds CAP_SYS_ADMIN and CAP_NET_ADMIN (it may enter the"
            " namespace)",
        )
    ref = as_ref(target)
    lacks = f"chosen: this process lacks {' + '.join(missing)} (not root)"
    if ref.kind == "container" and (ref.runtime is None or ref.runtime in helper_runtimes):
        return ModeChoice("helper", f"{lacks}, so a helper container cuts the namespace")
    if not strict:
        engines = " and ".join(helper_runtimes)
        return ModeChoice(
            "direct",
            f"{lacks}, and a {ref.runtime or ref.kind} sandbox has no helper mode ({engines}"
            " containers only): direct mode needs root",
        )
    raise PrivilegeError(
        f"{ref}: entering a network namespace needs root or CAP_SYS_ADMIN + CAP_NET_ADMIN"
        f" (missing: {' + '.join(missing)}); run netcut as root, or name a docker or podman"
        " container (--container ID) and a helper container does it without root"
    )

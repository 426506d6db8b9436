"""Which cut mode a preparation uses when the caller leaves it to the boundary
(`cut_mode="auto"`, the default: docs/user-guide.md#helper-mode), and why.

Direct mode enters the sandbox's namespace (setns), which needs CAP_SYS_ADMIN and
CAP_NET_ADMIN: root, as a rule. A framework's process is usually a docker-group user or runs
rootless podman and has neither; then a container sandbox is cut by netcut's helper, which
also opens its listeners (docs/netcut.md#listeners-from-the-helper). The decision is a pure
function of the capabilities read once from /proc/self/status.
"""

from __future__ import annotations

from netcut.targetref import TargetRef

# Capability bits (linux/capability.h)
CAP_NET_ADMIN = 12
CAP_SYS_ADMIN = 21


def effective_caps(status_text: str) -> int:
    """Pure: the `CapEff` mask of a /proc/PID/status text (0 when absent or unreadable)."""
    for line in status_text.splitlines():
        name, _, value = line.partition(":")
        if name == "CapEff":
            try:
                return int(value.strip(), 16)
            except ValueError:
                return 0
    return 0


def can_enter(caps: int) -> bool:
    """Whether a process with effective capabilities `caps` can use direct mode."""
    need = (1 << CAP_NET_ADMIN) | (1 << CAP_SYS_ADMIN)
    return caps & need == need


def decide(asked: str, ref: TargetRef, caps: int) -> tuple[str, str]:
    """Pure: (the cut mode, why), for `asked` ("auto", "direct" or "helper")."""
    if asked != "auto":
        return asked, f"cut_mode={asked!r} was asked for"
    if can_enter(caps):
        return (
            "direct",
            "this process holds CAP_SYS_ADMIN and CAP_NET_ADMIN (it can enter the namespace)",
        )
    lacks = "this process lacks CAP_SYS_ADMIN or CAP_NET_ADMIN (not root)"
    if ref.kind == "container" and ref.runtime != "containerd":
        return "helper", f"{lacks}: a helper container cuts the namespace and opens its listeners"
    return (
        "direct",
        f"{lacks}, and a {ref.kind} sandbox has no helper mode (docker and podman containers "
        "only): direct mode needs root",
    )


def own_caps() -> int:
    """This process's effective capabilities."""
    try:
        with open("/proc/self/status") as f:
            return effective_caps(f.read())
    except OSError:
        return 0


def choose(asked: str, ref: TargetRef) -> tuple[str, str]:
    """`decide` for this process."""
    return decide(asked, ref, own_caps() if asked == "auto" else 0)

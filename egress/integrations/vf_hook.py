"""Choosing egress where verifiers chooses runtimes
(docs/integrations.md#chosen-from-verifiers-config-and-cli).

verifiers 0.4 has no plug-in point for runtimes: `verifiers.v1.runtimes.make_runtime` looks
the runtime class up in `_runtime_cls(config)`, a fixed map from the config's `type`. Every
place that builds a runtime goes through it: `Agent.run` without a runtime, `Agent.provision`
(via `provision_runtime`), `vf-eval`, `vf-debug`, `runtime_is_local`. `install()` wraps that one
function, so verifiers' own config (`runtime.type = "docker"`, `allow`, `block`, a task's
`network_allow` / `network_block` through verifiers' `resolve_runtime_config`) builds our
runtime; nothing else of verifiers is touched. It is the least code that could break, and it
is checked: `install()` refuses a verifiers outside `SUPPORTED` or whose `make_runtime` no
longer calls `_runtime_cls`, naming what changed, instead of silently building verifiers' own
runtime (which would enforce verifiers' policy with verifiers' proxy, not ours).

`python -m egress.integrations.vf_hook [--runtime docker|namespace] vf-eval ARGS...`
runs verifiers' own CLI (`vf-eval`, `vf-debug`, ...) with the hook installed.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from collections.abc import Callable
from typing import Any, Literal

from ..errors import EgressError

# The verifiers releases the hook is tested on (tests/frameworks/test_verifiers_select.py)
SUPPORTED = ((0, 4, 0), (0, 5, 0))  # >= 0.4.0, < 0.5.0
Choice = Literal["docker", "namespace"]

_original: Callable[[Any], type] | None = None
_choice: Choice = "docker"


class UnsupportedVerifiers(EgressError):
    """The installed verifiers is not one the runtime hook is known to work with."""


def _version_tuple(text: str) -> tuple[int, ...]:
    parts: list[int] = []
    for piece in text.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit()) or "0"
        parts.append(int(digits))
    return tuple(parts)


def check_verifiers() -> Any:
    """verifiers' runtimes module, if the hook fits it; else `UnsupportedVerifiers` naming
    the installed version and what differs."""
    version = importlib.metadata.version("verifiers")
    low, high = SUPPORTED
    if not low <= _version_tuple(version) < high:
        raise UnsupportedVerifiers(
            f"verifiers {version} is not a version egress's runtime hook is tested on "
            f"(>= {'.'.join(map(str, low))}, < {'.'.join(map(str, high))}): "
            "build the runtime yourself (EgressDockerRuntime, NamespaceRuntime) and pass it "
            "to Agent.run(task, runtime=...)"
        )
    from verifiers.v1 import runtimes

    found = getattr(runtimes, "_runtime_cls", None)
    code = getattr(runtimes.make_runtime, "__code__", None)  # no source needed
    if not callable(found) or code is None or "_runtime_cls" not in code.co_names:
        raise UnsupportedVerifiers(
            f"verifiers {version}: make_runtime no longer looks runtimes up in _runtime_cls; "
            "egress's runtime hook cannot select its runtime"
        )
    return runtimes


def _egress_runtime_cls(config: Any) -> type:
    """`_runtime_cls` with egress's runtimes for docker / podman configs (and ours)."""
    from .verifiers import EgressDockerRuntime, EgressPodmanRuntime
    from .vf_runtime import NamespaceConfig, NamespaceRuntime

    kind = getattr(config, "type", None)
    if isinstance(config, NamespaceConfig):
        return NamespaceRuntime
    if kind in ("docker", "podman"):
        if _choice == "namespace":
            return NamespaceRuntime
        return EgressDockerRuntime if kind == "docker" else EgressPodmanRuntime
    assert _original is not None
    return _original(config)


def install(runtime: Choice | None = None) -> None:
    """From now on verifiers builds egress's runtime for `type = "docker"` / `"podman"`
    configs: `EgressDockerRuntime` / `EgressPodmanRuntime`, or with `runtime="namespace"`
    (or `$EGRESS_VERIFIERS_RUNTIME=namespace`) `NamespaceRuntime` on this host (a config
    naming an image other than the default is then refused). Idempotent; `uninstall()`
    undoes it. Raises `UnsupportedVerifiers` (see the module docstring)."""
    global _original, _choice
    chosen = runtime or os.environ.get("EGRESS_VERIFIERS_RUNTIME") or "docker"
    if chosen not in ("docker", "namespace"):
        raise ValueError(f"install runtime must be 'docker' or 'namespace', not {chosen!r}")
    runtimes = check_verifiers()
    _choice = chosen  # type: ignore[assignment]
    if runtimes._runtime_cls is not _egress_runtime_cls:
        _original = runtimes._runtime_cls
        runtimes._runtime_cls = _egress_runtime_cls


def uninstall() -> None:
    """verifiers builds its own runtimes again."""
    global _original
    from verifiers.v1 import runtimes

    if _original is not None and runtimes._runtime_cls is _egress_runtime_cls:
        runtimes._runtime_cls = _original
    _original = None


def main(argv: list[str] | None = None) -> None:
    """`[--runtime docker|namespace] vf-eval ARGS...`: a verifiers CLI with the hook."""
    args = list(sys.argv[1:] if argv is None else argv)
    choice: Choice | None = None
    if args[:1] == ["--runtime"] and len(args) > 1:
        choice = args[1]  # type: ignore[assignment]
        args = args[2:]
    if not args:
        raise SystemExit(
            "usage: python -m egress.integrations.vf_hook "
            "[--runtime docker|namespace] vf-eval|vf-debug|vf-validate ARGS..."
        )
    scripts = {e.name: e for e in importlib.metadata.entry_points(group="console_scripts")}
    entry = scripts.get(args[0])
    if entry is None or not entry.value.startswith("verifiers."):
        raise SystemExit(f"{args[0]!r} is not a verifiers command (vf-eval, vf-debug, ...)")
    install(choice)
    sys.argv = [args[0], *args[1:]]
    entry.load()()


if __name__ == "__main__":
    main()

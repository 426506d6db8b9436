"""Target resolution: a parsed reference (targetref.py) to a namespace file that exists.

Parsing is targetref.py's (pure, shared with egress). Resolution is thin: it checks that the
namespace file exists and, for a container, asks its runtime for the task's PID
(`docker|podman inspect`, `ctr -n NAMESPACE task ls`). The runtime is the explicit one, else
$NETCUT_CONTAINER_RUNTIME, else the first of docker, podman, containerd whose *engine answers*
(`docker info`, `podman info`, `ctr version` under a short timeout): a docker CLI without a
daemon is passed over for podman. None answering is a TargetNotFound naming each one tried
and why (docs/netcut.md#targets).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass

from netcut.errors import InvalidInput, TargetNotFound
from netcut.targetref import (
    CONTAINERD_NAMESPACE,
    NETNS_RUN_DIR,
    RUNTIMES,
    TargetRef,
    container,
    netns,
    netns_path,
    parse_target,
    pid,
)

RUNTIME_ENV = "NETCUT_CONTAINER_RUNTIME"
# ctr's own variable for its namespace; `--namespace` wins, k8s.io (the kubelet's) otherwise.
CONTAINERD_NAMESPACE_ENV = "CONTAINERD_NAMESPACE"
# `docker inspect` answers in well under a second; a hung engine must not hang a cut.
INSPECT_TIMEOUT_S = 10.0
# `docker version` against a live daemon takes ~0.1 s, `podman info` ~0.7 s, but on a busy
# machine a CLI's own start (Docker CE's client, a podman setting up its store) took over 3 s
# in CI runs and a live engine was passed over; one that does not answer in 10 s is passed
# over rather than waited for.
ANSWER_TIMEOUT_S = 10.0
# A detected engine is asked again after this long (an engine started or stopped meanwhile).
ANSWER_CACHE_S = 30.0
EXECUTABLES = {"docker": "docker", "podman": "podman", "containerd": "ctr"}
_ANSWER_ARGS = {
    "docker": ["version", "--format", "{{.Server.Version}}"],
    "podman": ["info", "--format", "{{.Version.Version}}"],
    "containerd": ["--connect-timeout", "2s", "version"],
}
# Runtimes a helper container can be started with (helper/mode.py): docker and podman join the
# container's namespace (`--network container:ID`), containerd the task's by its path
# (`ctr run --with-ns network:/proc/PID/ns/net`).
HELPER_RUNTIMES = ("docker", "podman", "containerd")

__all__ = [
    "CONTAINERD_NAMESPACE",
    "NETNS_RUN_DIR",
    "RUNTIMES",
    "ResolvedTarget",
    "TargetRef",
    "as_ref",
    "container",
    "containerd_namespace",
    "containerd_task",
    "find_runtime",
    "netns",
    "netns_path",
    "parse_nameservers",
    "pid",
    "resolve_target",
]


@dataclass(frozen=True)
class ResolvedTarget:
    ref: TargetRef
    path: str  # a file whose open fd names the namespace (setns-able)
    container_id: str | None = None
    runtime: str | None = None
    pid: int | None = None
    resolv_conf: str | None = None  # where the namespace's DNS configuration is visible

    def __str__(self) -> str:
        return f"{self.ref} ({self.path})"


def as_ref(target: TargetRef | ResolvedTarget | str | int) -> TargetRef:
    """The reference a value names (targetref.parse_target; a resolved target's own ref)."""
    if isinstance(target, ResolvedTarget):
        return target.ref
    return parse_target(target)


def runtime_candidates(
    flag: str | None,
    env: dict[str, str] | os._Environ[str],
    allowed: tuple[str, ...] = RUNTIMES,
) -> list[str]:
    """Runtimes to try, in order: the flag alone, else $NETCUT_CONTAINER_RUNTIME alone, else
    docker, podman, containerd (those of them in `allowed`)."""
    if flag:
        return [flag]
    chosen = env.get(RUNTIME_ENV, "").strip()
    return [chosen] if chosen else [r for r in RUNTIMES if r in allowed]


_answered: dict[str, tuple[float, str]] = {}


def _answers(name: str, path: str) -> str | None:
    """None when `name`'s engine answers, else why not (one line)."""
    cached = _answered.get(path)
    if cached is not None and time.monotonic() - cached[0] < ANSWER_CACHE_S:
        return None
    argv = [path, *_ANSWER_ARGS.get(name, ["version"])]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=ANSWER_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return f"no answer in {ANSWER_TIMEOUT_S:g}s"
    except OSError as exc:
        return exc.strerror or str(exc)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit {done.returncode}"]
        return lines[-1][:200]
    _answered[path] = (time.monotonic(), name)
    return None


def choose_runtime(flag: str | None = None, allowed: tuple[str, ...] = RUNTIMES) -> tuple[str, str]:
    """(name, executable) of the runtime to use. An explicit one (flag or environment) is
    used if installed; otherwise the first whose engine answers. TargetNotFound names every
    runtime tried and why it was passed over."""
    tried = runtime_candidates(flag, os.environ, allowed)
    explicit = len(tried) == 1 and (flag or os.environ.get(RUNTIME_ENV, "").strip())
    why = []
    for name in tried:
        found = shutil.which(EXECUTABLES.get(name, name))
        if not found:
            why.append(f"{name}: not on PATH")
            continue
        if explicit:
            return name, found
        reason = _answers(name, found)
        if reason is None:
            return name, found
        why.append(f"{name}: {reason}")
    said = "; ".join(why)
    raise TargetNotFound(f"no container runtime answered (tried {said}){socket_hint(said)}")


# An engine's socket this user may not use: what a user who is not root must be given.
_SOCKET_HINT = (
    " (this user may not use the engine's socket: add it to the group that owns the socket,"
    " e.g. `usermod -aG docker USER` and log in again, or use rootless podman)"
)


def socket_hint(said: str) -> str:
    """The fix for an engine's "permission denied" on its socket, or nothing."""
    lowered = said.lower()
    if "permission denied" in lowered and ("socket" in lowered or "dial unix" in lowered):
        return _SOCKET_HINT
    return ""


def find_runtime(flag: str | None = None, allowed: tuple[str, ...] = HELPER_RUNTIMES) -> str:
    """The executable of `choose_runtime(flag, allowed)` (docker or podman by default: the
    runtimes a helper container can be started with)."""
    return choose_runtime(flag, allowed)[1]


def resolve_target(target: TargetRef | ResolvedTarget | str | int) -> ResolvedTarget:
    """Resolve to a namespace path that exists. Raises TargetNotFound, InvalidInput."""
    if isinstance(target, ResolvedTarget):
        return target
    ref = as_ref(target)
    if ref.kind == "pid" and ref.bare and os.path.lexists(f"{NETNS_RUN_DIR}/{ref.value}"):
        raise InvalidInput(
            f"{ref.value!r} is a PID (targets in docs/netcut.md#targets), but a namespace of"
            f" that name exists too: write pid:{ref.value} or netns:{ref.value}"
        )
    if ref.kind == "netns":
        path = os.path.join(NETNS_RUN_DIR, ref.value)
        _must_exist(path, f"no network namespace named {ref.value!r} (looked for {path})")
        return ResolvedTarget(ref, path, resolv_conf=_netns_resolv_conf(ref.value))
    if ref.kind == "path":
        _must_exist(ref.value, f"no namespace file at {ref.value}")
        name = os.path.basename(ref.value) if ref.value.startswith(NETNS_RUN_DIR + "/") else None
        return ResolvedTarget(ref, ref.value, resolv_conf=_path_resolv_conf(ref.value, name))
    if ref.kind == "pid":
        return _pid_target(ref, int(ref.value))
    return _container_target(ref)


def _must_exist(path: str, message: str) -> None:
    if not os.path.lexists(path):  # lexists: /proc/PID/ns/net may exist yet be unreadable
        raise TargetNotFound(message)


def _pid_target(ref: TargetRef, number: int, **extra: str) -> ResolvedTarget:
    path = f"/proc/{number}/ns/net"
    _must_exist(path, f"no process {number} (looked for {path})")
    resolv = f"/proc/{number}/root/etc/resolv.conf"
    return ResolvedTarget(ref, path, pid=number, resolv_conf=resolv, **extra)


def containerd_namespace(ref: TargetRef) -> str:
    """The containerd namespace of a container reference: `--namespace`, else
    $CONTAINERD_NAMESPACE, else k8s.io (the kubelet's)."""
    env = os.environ.get(CONTAINERD_NAMESPACE_ENV, "").strip()
    return ref.namespace or env or CONTAINERD_NAMESPACE


def containerd_task(ref: TargetRef, ctr: str) -> ResolvedTarget:
    """A containerd task's namespace, by its PID (`ctr -n NS task ls`)."""
    return _containerd_target(ref, ctr, containerd_namespace(ref))


def _container_target(ref: TargetRef) -> ResolvedTarget:
    name, runtime = choose_runtime(ref.runtime)
    if name == "containerd":
        return containerd_task(ref, runtime)
    argv = [runtime, "inspect", "--format", "{{.State.Pid}}", ref.value]
    done = _ask(argv)
    out = done.stdout.strip()
    if done.returncode != 0 or not out.isdigit():
        why = done.stderr.strip().splitlines()[-1:] or [out or f"exit {done.returncode}"]
        raise TargetNotFound(f"container {ref.value!r} via {runtime}: {why[0]}")
    if int(out) == 0:
        raise TargetNotFound(f"container {ref.value!r} via {runtime}: not running")
    return _pid_target(ref, int(out), container_id=ref.value, runtime=runtime)


def _ask(argv: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=INSPECT_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise TargetNotFound(f"{' '.join(argv)}: no answer in {INSPECT_TIMEOUT_S:g}s") from None


def _containerd_target(ref: TargetRef, ctr: str, namespace: str) -> ResolvedTarget:
    """The PID of containerd task `ref.value` in `namespace` (`ctr -n NS task ls`)."""
    done = _ask([ctr, "-n", namespace, "task", "ls"])
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise TargetNotFound(f"containerd task {ref.value!r} (namespace {namespace}): {why}")
    task = parse_ctr_tasks(done.stdout).get(ref.value)
    where = f"containerd container {ref.value!r} in namespace {namespace}"
    if task is None:
        known = _ask([ctr, "-n", namespace, "containers", "info", ref.value]).returncode == 0
        raise TargetNotFound(
            f"{where}: not running (no task)"
            if known
            else f"{where}: no such container (another namespace? --namespace)"
        )
    number, status = task
    if number <= 0 or status not in ("RUNNING", "PAUSED"):
        raise TargetNotFound(f"{where}: not running ({status})")
    return _pid_target(ref, number, container_id=ref.value, runtime=ctr)


def parse_ctr_tasks(text: str) -> dict[str, tuple[int, str]]:
    """`ctr task ls` output → {task id: (pid, status)}; lines it cannot read are skipped."""
    tasks = {}
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 3 and fields[1].isdigit():
            tasks[fields[0]] = (int(fields[1]), fields[2])
    return tasks


def _netns_resolv_conf(name: str) -> str:
    specific = f"/etc/netns/{name}/resolv.conf"
    return specific if os.path.exists(specific) else "/etc/resolv.conf"


def _path_resolv_conf(path: str, name: str | None) -> str | None:
    if name:
        return _netns_resolv_conf(name)
    parts = path.split("/")  # /proc/PID/ns/net
    if len(parts) == 5 and parts[1] == "proc" and parts[2].isdigit():
        return f"/proc/{parts[2]}/root/etc/resolv.conf"
    return None


def parse_nameservers(text: str) -> tuple[str, ...]:
    """The `nameserver` addresses of a resolv.conf text, in order."""
    found = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0] == "nameserver":
            found.append(fields[1])
    return tuple(found)

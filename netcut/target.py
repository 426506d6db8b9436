"""Target references (`--netns`, `--netns-path`, `--pid`, `--container`) and their resolution.

Parsing is pure. Resolution is thin: it checks that the namespace file exists and, for a
container, asks the runtime for the container's PID (`docker|podman inspect`). The runtime is
chosen by the explicit flag, then $NETCUT_CONTAINER_RUNTIME, then docker, then podman; a runtime
that is missing is a TargetNotFound naming every runtime tried.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Literal

from netcut.errors import InvalidInput, TargetNotFound

NETNS_RUN_DIR = "/run/netns"
RUNTIMES = ("docker", "podman")
# Runtimes `--runtime` accepts; containerd is never autodetected (netcut/containerd.py).
KNOWN_RUNTIMES = (*RUNTIMES, "containerd")
RUNTIME_ENV = "NETCUT_CONTAINER_RUNTIME"
# `docker inspect` answers in well under a second; a hung engine must not hang a cut.
INSPECT_TIMEOUT_S = 10.0

Kind = Literal["netns", "path", "pid", "container"]


@dataclass(frozen=True)
class TargetRef:
    """What the caller named; `resolve_target` turns it into a namespace path."""

    kind: Kind
    value: str
    runtime: str | None = None  # containers only

    def __str__(self) -> str:
        flag = {"netns": "--netns", "path": "--netns-path", "pid": "--pid"}.get(
            self.kind, "--container"
        )
        return f"{flag} {self.value}"


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


def netns(name: str) -> TargetRef:
    if not name or "/" in name or name in (".", ".."):
        raise InvalidInput(f"--netns {name!r}: a namespace name has no '/' (use --netns-path)")
    return TargetRef("netns", name)


def netns_path(path: str) -> TargetRef:
    if not path.startswith("/"):
        raise InvalidInput(f"--netns-path {path!r}: give an absolute path")
    return TargetRef("path", path)


def pid(value: str | int) -> TargetRef:
    text = str(value)
    if not text.isdigit() or int(text) <= 0:
        raise InvalidInput(f"--pid {text!r}: not a process id")
    return TargetRef("pid", str(int(text)))


def container(ident: str, runtime: str | None = None) -> TargetRef:
    if not ident or ident.startswith("-"):
        raise InvalidInput(f"--container {ident!r}: not a container name or id")
    if runtime is not None and runtime not in KNOWN_RUNTIMES:
        raise InvalidInput(f"--runtime {runtime!r}: expected one of {', '.join(KNOWN_RUNTIMES)}")
    return TargetRef("container", ident, runtime)


def as_ref(target: TargetRef | ResolvedTarget | str | int) -> TargetRef:
    """Accept a ref, a resolved target, a PID, a path (starts with /) or a namespace name."""
    if isinstance(target, ResolvedTarget):
        return target.ref
    if isinstance(target, TargetRef):
        return target
    if isinstance(target, int):
        return pid(target)
    return netns_path(target) if target.startswith("/") else netns(target)


def runtime_candidates(flag: str | None, env: dict[str, str] | os._Environ[str]) -> list[str]:
    """Runtimes to try, in order: the flag alone, else $NETCUT_CONTAINER_RUNTIME alone, else
    docker then podman."""
    if flag:
        return [flag]
    chosen = env.get(RUNTIME_ENV, "").strip()
    return [chosen] if chosen else list(RUNTIMES)


def find_runtime(flag: str | None = None) -> str:
    """The container runtime to use (its executable path); TargetNotFound naming what was
    tried when none is installed."""
    tried = runtime_candidates(flag, os.environ)
    for name in tried:
        found = shutil.which(name)
        if found:
            return found
    raise TargetNotFound(f"no container runtime found (tried {', '.join(tried)} on PATH)")


def resolve_target(target: TargetRef | ResolvedTarget | str | int) -> ResolvedTarget:
    """Resolve to a namespace path that exists. Raises TargetNotFound, InvalidInput."""
    if isinstance(target, ResolvedTarget):
        return target
    ref = as_ref(target)
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


def _container_target(ref: TargetRef) -> ResolvedTarget:
    if ref.runtime == "containerd":
        from netcut.containerd import task_pid

        return _pid_target(ref, task_pid(ref.value), container_id=ref.value, runtime="ctr")
    runtime = find_runtime(ref.runtime)
    argv = [runtime, "inspect", "--format", "{{.State.Pid}}", ref.value]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=INSPECT_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise TargetNotFound(f"{' '.join(argv)}: no answer in {INSPECT_TIMEOUT_S:g}s") from None
    out = done.stdout.strip()
    if done.returncode != 0 or not out.isdigit():
        why = done.stderr.strip().splitlines()[-1:] or [out or f"exit {done.returncode}"]
        raise TargetNotFound(f"container {ref.value!r} via {runtime}: {why[0]}")
    if int(out) == 0:
        raise TargetNotFound(f"container {ref.value!r} via {runtime}: not running")
    return _pid_target(ref, int(out), container_id=ref.value, runtime=runtime)


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

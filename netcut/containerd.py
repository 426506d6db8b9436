"""containerd targets: a task's PID from `ctr`, for direct mode (docs/netcut.md#kubernetes).

containerd is what Kubernetes nodes run; its containers live in namespaces (`k8s.io` for
pods created by the kubelet). `ctr tasks ls` names each running task with its PID, and the
PID's /proc/PID/ns/net is the namespace to cut. The namespace is $CONTAINERD_NAMESPACE (ctr's
own variable), else `k8s.io`; the socket is $CONTAINERD_ADDRESS (also ctr's own), else ctr's
default /run/containerd/containerd.sock. Helper mode does not apply: ctr has no
`--network container:ID`, and a node agent can enter the namespace itself.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from netcut.errors import TargetNotFound

NAMESPACE_ENV = "CONTAINERD_NAMESPACE"
DEFAULT_NAMESPACE = "k8s.io"
# `ctr tasks ls` answers in milliseconds; a hung containerd must not hang a cut.
CTR_TIMEOUT_S = 10.0


def namespace(explicit: str | None = None) -> str:
    return explicit or os.environ.get(NAMESPACE_ENV, "").strip() or DEFAULT_NAMESPACE


def parse_tasks(text: str) -> dict[str, tuple[int, str]]:
    """`ctr tasks ls` output as {task id: (pid, status)}; the header line is skipped."""
    tasks: dict[str, tuple[int, str]] = {}
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 3 and fields[1].isdigit():
            tasks[fields[0]] = (int(fields[1]), fields[2])
    return tasks


def task_pid(container_id: str, ns: str | None = None) -> int:
    """The PID of `container_id`'s running task; TargetNotFound otherwise."""
    ctr = shutil.which("ctr")
    if ctr is None:
        raise TargetNotFound("no `ctr` on PATH (Debian package: containerd)")
    chosen = namespace(ns)
    argv = [ctr, "--namespace", chosen, "tasks", "ls"]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=CTR_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise TargetNotFound(f"{' '.join(argv)}: no answer in {CTR_TIMEOUT_S:g}s") from None
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise TargetNotFound(f"container {container_id!r} via containerd: {why}")
    tasks = parse_tasks(done.stdout)
    found = tasks.get(container_id)
    if found is None:
        raise TargetNotFound(
            f"container {container_id!r}: no task in containerd namespace {chosen!r}"
            f" (set ${NAMESPACE_ENV} to choose another)"
        )
    pid, state = found
    if pid == 0 or state.upper() != "RUNNING":
        raise TargetNotFound(f"container {container_id!r} via containerd: {state.lower()}")
    return pid

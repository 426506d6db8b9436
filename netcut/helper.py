"""Helper-container mode: for hosts whose process cannot enter the container's namespace.

A one-shot `--rm` container joins the target's network namespace (`--network container:ID`)
with NET_ADMIN and no other capability (`--cap-drop ALL --cap-add NET_ADMIN`), and runs the
rendered plan (render.py) with /bin/sh. `/proc/sys` is read-only in containers by default, so
the helper also gets `--security-opt systempaths=unconfined` (docker) or `unmask=/proc/sys`
(podman) to write the IPv6 sysctls; that adds no capability.

Three helper runs at most per cut: one dumps the namespace's state (`ip -j`, sysctls, chain
marks), the host plans from it, one applies the plan, and one probes (busybox `nc -z`). The
image is `--helper-image`, else $NETCUT_HELPER_IMAGE, else `netcut-helper:<hash>` built once
from the inline Dockerfile below and found again by its content hash. The record of the cut is
kept on the host, keyed by the container's full id.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import time
from typing import Any

from netcut import plan as plan_mod
from netcut.api import CutResult, KeepLike, RestoreResult, parse_keeps, probe_targets
from netcut.errors import ApplyFailed, InvalidInput, ProbeFailed, TargetNotFound, UnsafeTarget
from netcut.model import Keep, NamespaceState
from netcut.plan import CutStatus
from netcut.probe import ProbeItem, ProbeResult
from netcut.records import Store
from netcut.render import parse_state_dump, render_script, state_script
from netcut.target import TargetRef, find_runtime, parse_nameservers

IMAGE_ENV = "NETCUT_HELPER_IMAGE"
DOCKERFILE = """\
FROM alpine:3.20
RUN apk add --no-cache iproute2 iproute2-ss iptables iptables-legacy
"""
# Pulling alpine and installing three packages takes seconds; a helper run well under one.
BUILD_TIMEOUT_S = 600.0
RUN_TIMEOUT_S = 60.0
_DANGEROUS = {"NET_ADMIN", "NET_RAW", "SYS_ADMIN"}


def default_image() -> str:
    """The tag of the image built from DOCKERFILE: the same content gives the same tag."""
    return "netcut-helper:" + hashlib.sha256(DOCKERFILE.encode()).hexdigest()[:12]


def helper_argv(runtime: str, container_id: str, image: str, script: str) -> list[str]:
    """argv of one helper run: shares only the network namespace, holds only NET_ADMIN."""
    unmask = (
        "unmask=/proc/sys" if "podman" in os.path.basename(runtime) else ("systempaths=unconfined")
    )
    return [
        runtime,
        "run",
        "--rm",
        "--network",
        f"container:{container_id}",
        "--cap-drop",
        "ALL",
        "--cap-add",
        "NET_ADMIN",
        "--security-opt",
        unmask,
        "--entrypoint",
        "/bin/sh",
        image,
        "-c",
        script,
    ]


def _run(
    argv: list[str], timeout: float, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            argv, input=stdin, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        raise ApplyFailed(f"{argv[0]} {argv[1]}: no answer within {timeout:g}s") from None
    except FileNotFoundError:
        raise TargetNotFound(f"container runtime {argv[0]} not found") from None


def _why(done: subprocess.CompletedProcess[str]) -> str:
    lines = (done.stderr or done.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit {done.returncode}"


def ensure_image(runtime: str, image: str | None) -> str:
    """The helper image to run; builds the default one when it is not there yet."""
    chosen = image or os.environ.get(IMAGE_ENV, "").strip()
    if chosen:
        return chosen
    tag = default_image()
    if _run([runtime, "image", "inspect", tag], RUN_TIMEOUT_S).returncode == 0:
        return tag
    done = _run([runtime, "build", "-t", tag, "-"], BUILD_TIMEOUT_S, stdin=DOCKERFILE)
    if done.returncode != 0:
        raise TargetNotFound(f"building helper image {tag} with {runtime}: {_why(done)}")
    return tag


def container_findings(info: dict[str, Any]) -> tuple[str, ...]:
    """Capabilities the container's processes may hold that could undo a cut, judged from
    `inspect` (the host cannot read the container's /proc in this mode). The engines' default
    set includes NET_RAW, so a container that does not drop it is reported."""
    host = info.get("HostConfig") or {}
    if host.get("Privileged"):
        return ("container is privileged (all capabilities)",)
    added = {str(c).upper().removeprefix("CAP_") for c in host.get("CapAdd") or ()}
    dropped = {str(c).upper().removeprefix("CAP_") for c in host.get("CapDrop") or ()}
    held = set(_DANGEROUS & added) if "ALL" not in added else set(_DANGEROUS)
    if "NET_RAW" not in dropped and "ALL" not in dropped:
        held.add("NET_RAW")
    return tuple(f"container may hold CAP_{name}" for name in sorted(held))


class _Helper:
    """One container target: its runtime, full id, inspect data, and the helper image."""

    def __init__(self, ref: TargetRef, image: str | None) -> None:
        if ref.kind != "container":
            raise InvalidInput(f"{ref}: helper mode needs --container")
        self.ref = ref
        self.runtime = find_runtime(ref.runtime)
        done = _run([self.runtime, "inspect", "--format", "{{json .}}", ref.value], RUN_TIMEOUT_S)
        if done.returncode != 0:
            raise TargetNotFound(f"container {ref.value!r} via {self.runtime}: {_why(done)}")
        try:
            info = json.loads(done.stdout)
            self.info: dict[str, Any] = info[0] if isinstance(info, list) else info
            self.id = str(self.info["Id"])
            pid = int(self.info.get("State", {}).get("Pid") or 0)
        except (ValueError, KeyError, IndexError, TypeError):
            raise TargetNotFound(f"container {ref.value!r}: unreadable inspect output") from None
        if pid == 0:
            raise TargetNotFound(f"container {ref.value!r} via {self.runtime}: not running")
        self.pid = pid
        self.store = Store.for_container(self.id)
        self.image = ensure_image(self.runtime, image)

    def __str__(self) -> str:
        return f"{self.ref} (helper via {os.path.basename(self.runtime)})"

    def run(self, script: str) -> str:
        done = _run(helper_argv(self.runtime, self.id, self.image, script), RUN_TIMEOUT_S)
        if done.returncode != 0:
            raise ApplyFailed(f"helper container failed: {_why(done)}")
        return done.stdout

    def state(self, keeps: tuple[Keep, ...] = ()) -> NamespaceState:
        return parse_state_dump(self.run(state_script(keeps)), self.nameservers())

    def nameservers(self) -> tuple[str, ...]:
        try:
            with open(f"/proc/{self.pid}/root/etc/resolv.conf") as f:
                return parse_nameservers(f.read())
        except OSError:
            return ()


def probe_script(reachable: tuple[Keep, ...], blocked: tuple[Keep, ...], timeout: float) -> str:
    secs = str(max(1, round(timeout)))
    lines = []
    for keep in (*reachable, *blocked):
        addr, port = shlex.quote(str(keep.addr)), str(keep.port)
        lines.append(
            f"if nc -z -w {secs} {addr} {port} </dev/null >/dev/null 2>&1;"
            f" then echo 'connected {keep}'; else echo 'failed {keep}'; fi"
        )
    return "\n".join(lines) + "\n"


def parse_probe(text: str, reachable: tuple[Keep, ...], blocked: tuple[Keep, ...]) -> ProbeResult:
    """Read `probe_script` output: one `connected TARGET` or `failed TARGET` line each."""
    outcomes: dict[str, str] = {}
    for line in text.splitlines():
        outcome, _, name = line.partition(" ")
        outcomes[name.strip()] = outcome
    items = [ProbeItem(str(k), "reachable", outcomes.get(str(k), "no answer")) for k in reachable]
    items += [ProbeItem(str(k), "blocked", outcomes.get(str(k), "no answer")) for k in blocked]
    return ProbeResult(tuple(items))


def cut(
    target: TargetRef,
    keep: list[KeepLike] | tuple[KeepLike, ...] = (),
    *,
    image: str | None = None,
    probe: bool = True,
    expect_blocked: list[KeepLike] | tuple[KeepLike, ...] = (),
    force: bool = False,
    allow_privileged: bool = False,
    dry_run: bool = False,
    probe_timeout: float = 1.0,
) -> CutResult:
    """The helper-mode twin of api.cut (same result, same errors). `force` is accepted for
    symmetry: a container's namespace is never the host's."""
    del force
    keeps, blocked = parse_keeps(keep), probe_targets(expect_blocked, "expect_blocked")
    h = _Helper(target, image)
    findings = container_findings(h.info)
    if findings and not allow_privileged and not dry_run:
        raise UnsafeTarget(
            f"refusing to cut {h}: {'; '.join(findings)}; pass --allow-privileged to cut anyway",
            findings,
        )
    with h.store.locked():
        result = _cut_locked(h, keeps, dry_run)
    if result.dry_run:
        return result
    return _probed(h, result, keeps, blocked, probe, probe_timeout)


def _cut_locked(h: _Helper, keeps: tuple[Keep, ...], dry_run: bool) -> CutResult:
    start = time.perf_counter()
    record = h.store.load()
    state = h.state(keeps)
    status = plan_mod.judge_status(record, state)
    if status.is_cut:
        if record is not None and set(record.keeps) != set(keeps) and not dry_run:
            raise InvalidInput(f"{h} is already cut with other keeps; restore it first")
        return CutResult(str(h), status, record, False, dry_run=dry_run)
    if status.state == "partial" and not dry_run:
        _undo(h, record, state)
        state = h.state(keeps)
    planned = plan_mod.plan_cut(state, keeps)
    if dry_run:
        script = render_script(planned.ops)
        return CutResult(str(h), status, planned, False, dry_run=True, script=script)
    h.store.save(planned, {"target": str(h), "container": h.id})
    try:
        h.run(render_script(planned.ops))
    except ApplyFailed as exc:
        rollback = tuple(i for op in reversed(planned.ops) if (i := plan_mod.invert(op)))
        h.run(render_script(rollback, tolerant=True))
        h.store.remove()
        raise ApplyFailed(f"cut via helper failed and was rolled back: {exc}") from None
    elapsed = (time.perf_counter() - start) * 1000
    return CutResult(str(h), CutStatus("cut", keeps), planned, True, elapsed_ms=elapsed)


def _probed(
    h: _Helper,
    result: CutResult,
    keeps: tuple[Keep, ...],
    blocked: tuple[Keep, ...],
    probe: bool,
    timeout: float,
) -> CutResult:
    reachable = tuple(k for k in keeps if k.port is not None)
    if not probe or not (reachable or blocked):
        return result
    found = parse_probe(h.run(probe_script(reachable, blocked, timeout)), reachable, blocked)
    if not found.ok:
        raise ProbeFailed(f"{h} is cut but the probe failed: {found.reason()}", found)
    return CutResult(
        result.target, result.status, result.plan, result.changed, found, result.elapsed_ms
    )


def _undo(h: _Helper, record: plan_mod.CutPlan | None, state: NamespaceState) -> tuple[str, ...]:
    undo = plan_mod.plan_restore(record, state)
    h.run(render_script(undo.ops, tolerant=True))
    h.store.remove()
    return tuple(undo.lines())


def restore(target: TargetRef, *, image: str | None = None) -> RestoreResult:
    """Helper-mode twin of api.restore."""
    h = _Helper(target, image)
    with h.store.locked():
        record = h.store.load()
        state = h.state()
        if plan_mod.judge_status(record, state).state == "not cut":
            h.store.remove()
            return RestoreResult(str(h), False, CutStatus("not cut"))
        lines = _undo(h, record, state)
        return RestoreResult(str(h), True, plan_mod.judge_status(None, h.state()), lines)


def status(target: TargetRef, *, image: str | None = None) -> CutStatus:
    """Helper-mode twin of api.status."""
    h = _Helper(target, image)
    return plan_mod.judge_status(h.store.load(), h.state())

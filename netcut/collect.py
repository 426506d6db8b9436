"""Collect the records of namespaces that no longer exist (`netcut gc`, and now and then at a
cut: docs/netcut.md#collecting-records).

A record is named by its namespace's nsfs identity (st_dev, st_ino). A namespace exists while
anything holds it: a process or thread in it, a bind mount of its nsfs file (`ip netns add`,
container runtimes), or an open file descriptor to that file. This module reads all three from
/proc (every task's ns/net, this mount namespace's mountinfo, every process's fd links) and
removes, under each record's lock, the records whose namespace none of them names. A
namespace held only by a socket opened in it (no process, mount or fd) cannot be entered again
by anyone, so its record could never be used and goes too.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass

from netcut.records import Store, recorded_namespaces
from netcut.safety import own_effective_caps

CAP_SYS_PTRACE = 19

# The cut collects at most this often per worker process (a full /proc scan costs ~ms).
CUT_COLLECT_EVERY_S = 10.0
_last_collect = 0.0


@dataclass(frozen=True)
class Collected:
    removed: tuple[str, ...]  # record keys removed
    kept: int  # records of namespaces that exist


def _nsfs_inode(link: str) -> int | None:
    """`net:[4026532001]` -> 4026532001."""
    if link.startswith("net:[") and link.endswith("]"):
        digits = link[5:-1]
        return int(digits) if digits.isdigit() else None
    return None


def live_namespaces() -> set[tuple[int, int]]:
    """The identities of every network namespace something on this host still holds."""
    return _scan()[0]


def _scan() -> tuple[set[tuple[int, int]], bool]:
    """`live_namespaces`, and whether the scan can be trusted to see every holder: a process
    without CAP_SYS_PTRACE (a user who is not root) cannot read another user's
    /proc/PID/ns/net, so a namespace missing from its scan may still be held (a container's,
    by processes of root's). Root's scan counts as whole, as it always did (a process it
    may not read, like an init of a sandbox the host runs in, is skipped)."""
    complete = bool(own_effective_caps() >> CAP_SYS_PTRACE & 1)
    live: set[tuple[int, int]] = set()
    own = os.stat("/proc/self/ns/net").st_dev  # every nsfs inode has the same st_dev
    inodes: set[int] = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                found = _nsfs_inode(os.readlink(f"/proc/{pid}/task/{tid}/ns/net"))
                if found is not None:
                    inodes.add(found)
            fd_dir = f"/proc/{pid}/fd"
            for fd in os.listdir(fd_dir):
                try:
                    found = _nsfs_inode(os.readlink(f"{fd_dir}/{fd}"))
                except OSError:
                    continue
                if found is not None:
                    inodes.add(found)
        except OSError:
            continue  # exited meanwhile, or not ours to read
    live.update((own, ino) for ino in inodes)
    live.update(_mounted_namespaces())
    return live, complete


def _mounted_namespaces() -> set[tuple[int, int]]:
    """Namespaces bind-mounted in this mount namespace (nsfs mounts: /run/netns/NAME, ...)."""
    found: set[tuple[int, int]] = set()
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.readlines()
    except OSError:
        return found
    for line in lines:
        before, _, after = line.partition(" - ")
        if not after.startswith("nsfs ") or " net:[" not in before:
            continue
        point = before.split()[4].encode().decode("unicode_escape")  # \040 for a space
        try:
            st = os.stat(point)
        except OSError:
            continue
        found.add((st.st_dev, st.st_ino))
    return found


def collect(directory: str) -> Collected:
    """Remove the records in `directory` whose namespace no longer exists. Where this
    process cannot see every namespace's holders (a user who is not root), a record goes
    only when it names a container that its runtime no longer runs (helper mode's records
    do); any other is kept, since its namespace may well exist."""
    recorded = [f"{dev}-{ino}" for dev, ino in recorded_namespaces(directory)]
    recorded += recorded_containers(directory)
    if not recorded:
        return Collected((), 0)
    live, complete = _scan()
    removed = []
    for key in recorded:
        dev, _, ino = key.partition("-")
        if dev.isdigit() and ino.isdigit() and (int(dev), int(ino)) in live:
            continue
        store = Store(directory, key)
        if not (complete and dev.isdigit()) and not _container_gone(store):
            continue
        with store.locked():
            if os.path.exists(store.path):
                store.remove()
                removed.append(store.key)
    return Collected(tuple(removed), len(recorded) - len(removed))


def recorded_containers(directory: str) -> list[str]:
    """Keys of the records an older netcut's helper mode kept by container id."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return [n[:-5] for n in names if n.startswith("container-") and n.endswith(".json")]


def _container_gone(store: Store) -> bool:
    """Whether the container a record names is no longer running, asked of its runtime: its
    namespace went with it (a container started again gets a new one). False when the record
    names none, or the runtime cannot say."""
    meta: dict[str, str] = {}
    try:
        with open(store.path) as f:
            data = json.loads(f.readline())
        if isinstance(data.get("meta"), dict):
            meta = {str(k): str(v) for k, v in data["meta"].items()}
    except (OSError, ValueError, AttributeError):
        return False
    container = meta.get("container") or store.key.removeprefix("container-")
    if not container or container == store.key:
        return False
    runtime = meta.get("runtime") or "docker"
    if os.path.basename(runtime) == "ctr":
        return False  # its tasks are asked by namespace; a record of one stays for `restore`
    try:
        done = subprocess.run(
            [runtime, "inspect", "--format", "{{.State.Running}}", container],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    if done.returncode == 0:
        return done.stdout.strip() == "false"
    said = (done.stderr + done.stdout).lower()
    return "no such" in said or "no container" in said


def collect_if_due(directory: str) -> None:
    """`collect`, at most every CUT_COLLECT_EVERY_S per process (a cut calls it after its
    own work; an error here never fails the cut that called it)."""
    global _last_collect
    now = time.monotonic()
    if now - _last_collect < CUT_COLLECT_EVERY_S:
        return
    _last_collect = now
    try:
        collect(directory)
    except Exception:  # housekeeping: `netcut gc` reports what fails here
        return

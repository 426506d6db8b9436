"""Where a cut is recorded so that `restore` can undo exactly it.

One JSON file per namespace, `$NETCUT_STATE_DIR/<st_dev>-<st_ino>.json` in direct mode and
`container-<full id>.json` in helper mode (default directory /run/netcut: tmpfs, so records
vanish with the boot, as do the namespaces they describe). The
file is written atomically before the cut's first change and removed after a restore. A record
alone proves nothing: status also checks the namespace's own marks (routes with protocol
NETCUT_PROTO, chain NETCUT), so a stale record left by a namespace whose inode was reused is
reported as a partial cut and cleaned up by restore or the next cut.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from netcut.errors import InvalidInput
from netcut.plan import CutPlan, plan_from_data, plan_to_data

STATE_DIR_ENV = "NETCUT_STATE_DIR"
DEFAULT_STATE_DIR = "/run/netcut"


def state_dir() -> str:
    return os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR


@dataclass(frozen=True)
class Store:
    """Where one namespace's record lives. Built by the caller (so the namespace worker, a
    long-lived process, follows the caller's current $NETCUT_STATE_DIR) and passed to jobs."""

    directory: str
    key: str

    @classmethod
    def for_namespace(cls, identity: tuple[int, int]) -> Store:
        dev, ino = identity
        return cls(state_dir(), f"{dev}-{ino}")

    @classmethod
    def for_container(cls, container_id: str) -> Store:
        return cls(state_dir(), f"container-{container_id}")

    @property
    def path(self) -> str:
        return os.path.join(self.directory, f"{self.key}.json")

    def save(self, plan: CutPlan, meta: dict[str, str]) -> None:
        """Write atomically (temporary file, then rename)."""
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        data: dict[str, Any] = {**plan_to_data(plan), "meta": meta, "created": time.time()}
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(data, f, sort_keys=True)
        os.replace(tmp, self.path)

    def load(self) -> CutPlan | None:
        """The recorded plan, or None. Raises InvalidInput for a record it cannot read."""
        try:
            with open(self.path) as f:
                data = json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise InvalidInput(f"netcut record {self.path}: {exc}") from None
        return plan_from_data(data)

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Serialize cuts and restores across processes (flock, released when the holder
        exits, however it exits). One lock for the directory, not one per namespace: a cut
        takes milliseconds, and a per-namespace lock file could never be removed safely."""
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        fd = os.open(os.path.join(self.directory, ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def remove(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

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

import json
import os
import time
from typing import Any

from netcut.errors import InvalidInput
from netcut.plan import CutPlan, plan_from_data, plan_to_data

STATE_DIR_ENV = "NETCUT_STATE_DIR"
DEFAULT_STATE_DIR = "/run/netcut"


def state_dir() -> str:
    return os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR


def ns_key(identity: tuple[int, int]) -> str:
    """The record key of a namespace known by its nsfs (st_dev, st_ino)."""
    dev, ino = identity
    return f"{dev}-{ino}"


def record_path(key: str) -> str:
    return os.path.join(state_dir(), f"{key}.json")


def save(key: str, plan: CutPlan, meta: dict[str, str]) -> None:
    path = record_path(key)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    data: dict[str, Any] = {**plan_to_data(plan), "meta": meta, "created": time.time()}
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, sort_keys=True)
    os.replace(tmp, path)


def load(key: str) -> CutPlan | None:
    """The recorded plan, or None. Raises InvalidInput for a record it cannot read."""
    path = record_path(key)
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise InvalidInput(f"netcut record {path}: {exc}") from None
    return plan_from_data(data)


def remove(key: str) -> None:
    try:
        os.unlink(record_path(key))
    except FileNotFoundError:
        pass

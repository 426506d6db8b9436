"""Where a cut is recorded so that `restore` can undo exactly it.

One file per namespace, `<st_dev>-<st_ino>.json` in both modes (helper mode: the identity
the helper sees from inside; `container-<full id>.json` only when neither it nor the host can
tell), in $NETCUT_STATE_DIR, else /run/netcut for root (tmpfs, so records vanish with the
boot, as do the namespaces they describe), else a checked directory of the user's own
(`user_state_dir`: docs/netcut.md#the-record-directory; the directory and its checks are
statedir.py's). Each record carries the boot id, and
one of another boot is ignored. A record is written atomically
*before* the cut's first change. In direct mode it is a journal (docs/netcut.md#the-journal):
line 1 is the plan (JSON), and the worker appends one line per op as each completes, so a cut
killed at any point, worker and caller alike, leaves a record that says which ops ran; the
record is removed only after a restore or a completed rollback. A record alone proves
nothing: status also checks the namespace's own marks (routes with protocol NETCUT_PROTO,
chain NETCUT), so a stale record left by a namespace whose inode was reused is reported as a
partial cut and cleaned up by restore or the next cut.

The format on disk (and in `netcut cut --json`) is version 1 as it always was: a rule's
verdict is written in the words records have always used (ACCEPT, REJECT-RST, REDIRECT...),
mapped to and from the plan's own words here, so a record written by any netcut version
restores with any other (docs/netcut.md#the-journal).

Every failure of the directory itself (read-only, full, not ours) is a `StateError` raised
before the namespace is touched, with no temporary file left behind.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import struct
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from netcut.errors import InvalidInput
from netcut.plan.changes import (
    AddAddr,
    AddBackstop,
    AddRedirect,
    AddRoute,
    DelAddr,
    DelRoute,
    KillFlows,
    Op,
    RemoveBackstop,
    RemoveRedirect,
    SetSysctl,
)
from netcut.plan.model import Addr, OutputRule, RedirectRule, Route, parse_keep
from netcut.plan.planner import CutPlan
from netcut.statedir import (
    BOOT_ID_PATH,
    DEFAULT_STATE_DIR,
    STATE_DIR_ENV,
    boot_id,
    check_private,
    checked_default,
    state_dir,
    state_error,
    user_state_dir,
)

# Format version of the JSON record written before a cut.
RECORD_VERSION = 1
LOCK_NAME = ".lock"
# struct flock (x86_64, aarch64): l_type, l_whence, l_start, l_len, l_pid, padding.
_FLOCK = struct.Struct("hhqqi4x")
_F_OFD_SETLKW = getattr(fcntl, "F_OFD_SETLKW", 38)


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

    def _makedirs(self) -> None:
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise state_error(self.directory, exc, "create it") from None
        if self.directory == checked_default():
            check_private(self.directory)

    def save(self, plan: CutPlan, meta: dict[str, str], *, journal: bool = False) -> None:
        """Write atomically (temporary file, then rename); on any failure the temporary file
        is removed and StateError raised. With `journal`, completed ops are appended later
        (`Journal`); without it the record stands for a complete cut."""
        self._makedirs()
        if boot_id():
            meta = {**meta, "boot": boot_id()}
        text = record_text(plan, meta, time.time(), journal=journal) + "\n"
        tmp = f"{self.path}.{os.getpid()}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                view = memoryview(text.encode())
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except OSError as exc:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise state_error(self.directory, exc, f"write the record {self.key}.json") from None

    def load(self) -> CutPlan | None:
        """The recorded plan (with `applied` set from a journal), or None (also for a record
        written during another boot: a directory under $HOME or /tmp may outlive a reboot, its
        namespaces never do). Raises InvalidInput for a record it cannot read."""
        try:
            with open(self.path) as f:
                text = f.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise InvalidInput(f"netcut record {self.path}: {exc}") from None
        head, _, tail = text.partition("\n")
        try:
            data = json.loads(head)
        except ValueError as exc:
            raise InvalidInput(f"netcut record {self.path}: {exc}") from None
        if not isinstance(data, dict):
            raise InvalidInput(f"netcut record {self.path}: not a JSON object")
        meta = data.get("meta")
        boot = meta.get("boot") if isinstance(meta, dict) else None
        if boot and boot_id() and boot != boot_id():
            return None  # a namespace of another boot: gone, whatever its inode says now
        plan = plan_from_data(data)
        if data.get("journal"):
            plan = replace(plan, applied=journal_progress(tail))
        return plan

    def journal(self) -> Journal:
        """The record's journal, for appending completed ops (after `save(journal=True)`)."""
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        except OSError as exc:
            raise state_error(self.directory, exc, f"open the record {self.key}.json") from None
        return Journal(self.directory, fd)

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Serialize cuts and restores of *this namespace* across processes and threads: an
        open-file-description lock (released when its holder exits, however it exits) on
        one byte of the directory's `.lock` file, chosen by the key. Other namespaces lock
        other bytes and run at the same time; two keys sharing a byte only wait for each
        other. One lock file rather than one per namespace: a lock file could never be
        removed safely."""
        self._makedirs()
        try:
            path = os.path.join(self.directory, LOCK_NAME)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise state_error(self.directory, exc, "open its lock file for writing") from None
        try:
            offset = zlib.crc32(self.key.encode()) & 0x7FFFFFFF
            lock = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, offset, 1, 0)
            try:
                fcntl.fcntl(fd, _F_OFD_SETLKW, lock)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise state_error(self.directory, exc, "lock a record") from None
                fcntl.flock(fd, fcntl.LOCK_EX)  # no OFD locks (Linux < 3.15): the whole file
            yield
        finally:
            os.close(fd)

    def remove(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise state_error(self.directory, exc, f"remove the record {self.key}.json") from None


class Journal:
    """The append end of a record: one line per op that completed, by its index."""

    def __init__(self, directory: str, fd: int) -> None:
        self.directory = directory
        self.fd = fd

    def step(self, index: int) -> None:
        """Note op `index` as done; StateError when the directory cannot take the line."""
        try:
            os.write(self.fd, b"%d\n" % index)
        except OSError as exc:
            raise state_error(self.directory, exc, "append to a record") from None

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def journal_progress(tail: str) -> int:
    """How many ops the journal lines say completed (ops complete in order: the highest
    index + 1). A torn last line (the writer killed mid-write) is ignored."""
    done = 0
    for line in tail.splitlines():
        if line.strip().isdigit():
            done = max(done, int(line) + 1)
    return done


# ---------------------------------------------------------------- collecting dead records


def recorded_namespaces(directory: str) -> list[tuple[int, int]]:
    """The namespace identities (st_dev, st_ino) that have a record in `directory`."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise state_error(directory, exc, "list it") from None
    found = []
    for name in names:
        stem, dot, ext = name.partition(".")
        dev, dash, ino = stem.partition("-")
        if ext == "json" and dot and dash and dev.isdigit() and ino.isdigit():
            found.append((int(dev), int(ino)))
    return found


# ---------------------------------------------------------------- the plan as JSON

_OPS: dict[str, type[Any]] = {
    cls.__name__: cls
    for cls in (
        AddBackstop,
        RemoveBackstop,
        AddRedirect,
        RemoveRedirect,
        AddRoute,
        DelRoute,
        AddAddr,
        DelAddr,
        SetSysctl,
        KillFlows,
    )
}
# The plan's verdicts as records spell them (the words of record version 1).
_VERDICTS = {"allow": "ACCEPT", "reject": "REJECT", "reset": "REJECT-RST"}
_REDIRECT_VERDICTS = {"pass": "RETURN", "redirect": "REDIRECT"}
_FROM_VERDICTS = {v: k for k, v in _VERDICTS.items()}
_FROM_REDIRECT_VERDICTS = {v: k for k, v in _REDIRECT_VERDICTS.items()}


def plan_to_data(plan: CutPlan) -> dict[str, Any]:
    """The plan as a record's first line (and `netcut cut --json`'s "plan")."""
    return {
        "version": RECORD_VERSION,
        "keeps": [str(k) for k in plan.keeps],
        "nameservers": list(plan.nameservers),
        "ops": [{"op": type(op).__name__, **_data(op)} for op in plan.ops],
    }


def record_text(plan: CutPlan, meta: dict[str, str], created: float, *, journal: bool) -> str:
    """A record's first line: `json.dumps` of `plan_to_data(plan)` with `meta`, `created`
    (and `journal`), keys sorted, character for character; each op's JSON is made once per
    process (`_op_text`), since a worker writes the same backstop, sysctl and route ops for
    sandbox after sandbox (a record is written on every cut: docs/netcut.md#latency)."""
    parts = {
        "created": json.dumps(created),
        "keeps": json.dumps([str(k) for k in plan.keeps]),
        "meta": json.dumps(meta, sort_keys=True),
        "nameservers": json.dumps(list(plan.nameservers)),
        "ops": "[" + ", ".join(_op_text(op) for op in plan.ops) + "]",
        "version": json.dumps(RECORD_VERSION),
    }
    if journal:
        parts["journal"] = "true"
    return "{" + ", ".join(f"{json.dumps(k)}: {parts[k]}" for k in sorted(parts)) + "}"


_op_texts: dict[tuple[type[Any], Op], str] = {}
# Bounded: the ops of a long-lived worker's sandboxes repeat, their keeps and routes may not.
_OP_TEXTS_MAX = 1024


def _op_text(op: Op) -> str:
    """One op as `plan_to_data` writes it, as JSON with sorted keys."""
    key = (type(op), op)
    text = _op_texts.get(key)
    if text is None:
        if len(_op_texts) >= _OP_TEXTS_MAX:
            _op_texts.clear()
        text = json.dumps({"op": type(op).__name__, **_data(op)}, sort_keys=True)
        _op_texts[key] = text
    return text


def _data(obj: Any) -> Any:
    """Like dataclasses.asdict, without its deep copies (a record is written on every cut)."""
    if isinstance(obj, OutputRule):
        return {**_fields(obj), "verdict": _VERDICTS[obj.verdict]}
    if isinstance(obj, RedirectRule):
        return {**_fields(obj), "verdict": _REDIRECT_VERDICTS[obj.verdict]}
    if hasattr(obj, "__dataclass_fields__"):
        return _fields(obj)
    if isinstance(obj, tuple | list):
        return [_data(item) for item in obj]
    return obj


def _fields(obj: Any) -> dict[str, Any]:
    return {name: _data(value) for name, value in vars(obj).items()}


def plan_from_data(data: dict[str, Any]) -> CutPlan:
    """Inverse of `plan_to_data`; raises InvalidInput for a record it does not understand."""
    try:
        if data["version"] != RECORD_VERSION:
            raise InvalidInput(f"record version {data['version']!r} is not {RECORD_VERSION}")
        ops = tuple(_op_from_data(dict(item)) for item in data["ops"])
        keeps = tuple(parse_keep(k) for k in data["keeps"])
        return CutPlan(keeps, ops, tuple(data.get("nameservers", ())))
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidInput(f"unreadable netcut record: {exc!r}") from None


def _op_from_data(item: dict[str, Any]) -> Op:
    cls = _OPS[item.pop("op")]
    if "route" in item:
        item["route"] = _route_from_data(item["route"])
    if "addr" in item:
        item["addr"] = Addr(**item["addr"])
    if "rules" in item:
        item["rules"] = tuple(_rule_from_data(cls is AddRedirect, dict(r)) for r in item["rules"])
    if "allowed" in item:
        item["allowed"] = tuple((a, p) for a, p in item["allowed"])
    op: Op = cls(**item)
    return op


def _rule_from_data(redirect: bool, data: dict[str, Any]) -> OutputRule | RedirectRule:
    if redirect:
        data["verdict"] = _FROM_REDIRECT_VERDICTS[data["verdict"]]
        return RedirectRule(**data)
    data["verdict"] = _FROM_VERDICTS[data["verdict"]]
    return OutputRule(**data)


def _route_from_data(data: dict[str, Any]) -> Route:
    data = dict(data)
    data["metrics"] = tuple((str(k), int(v)) for k, v in data.get("metrics", ()))
    return Route(**data)


__all__ = [
    "BOOT_ID_PATH",
    "DEFAULT_STATE_DIR",
    "LOCK_NAME",
    "RECORD_VERSION",
    "STATE_DIR_ENV",
    "Journal",
    "Store",
    "boot_id",
    "check_private",
    "journal_progress",
    "plan_from_data",
    "plan_to_data",
    "record_text",
    "recorded_namespaces",
    "state_dir",
    "user_state_dir",
]

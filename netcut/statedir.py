"""The record directory: where netcut keeps its records, and the checks on it
(docs/netcut.md#the-record-directory).

$NETCUT_STATE_DIR, else /run/netcut for root (tmpfs, so records vanish with the boot, as do
the namespaces they describe), else a directory of the user's own (`user_state_dir`), which
`check_private` refuses unless it is a real directory of this user's that no one else may
enter: a record says which routes to put back. Every failure of the directory itself is a
`StateError` whose message says how to fix it; `boot_id` names this boot, so a record of
another one is ignored.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile

from netcut.errors import StateError

STATE_DIR_ENV = "NETCUT_STATE_DIR"
DEFAULT_STATE_DIR = "/run/netcut"

# Where the kernel names this boot: a record from another boot describes a namespace that is
# gone, whatever its inode says now (docs/netcut.md#collecting-records).
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
_STATE_FIX = (
    f"set ${STATE_DIR_ENV} to a directory of your own (mode 0700), or unset it: a user"
    " other than root gets $XDG_RUNTIME_DIR/netcut, else /tmp/netcut-UID"
)


def state_dir() -> str:
    """The record directory: $NETCUT_STATE_DIR as given; else /run/netcut for root (tmpfs);
    else a directory of this user's own (`user_state_dir`), checked before it is used."""
    given = os.environ.get(STATE_DIR_ENV)
    if given:
        return given
    if os.geteuid() == 0:
        return DEFAULT_STATE_DIR
    return user_state_dir()


def user_state_dir() -> str:
    """A non-root user's record directory: `$XDG_RUNTIME_DIR/netcut` (a tmpfs of the user's
    own, emptied at logout and reboot) when $XDG_RUNTIME_DIR is a directory this user owns
    that no one else may enter, else `/tmp/netcut-UID`. Never a shared world-writable path:
    the directory itself is checked (`check_private`) before a record is read or written."""
    uid = os.geteuid()
    runtime = os.environ.get("XDG_RUNTIME_DIR") or ""
    if runtime.startswith("/"):
        try:
            st = os.stat(runtime)
        except OSError:
            st = None
        if st is not None and st.st_uid == uid and not st.st_mode & 0o077:
            return os.path.join(runtime, "netcut")
    return os.path.join(tempfile.gettempdir(), f"netcut-{uid}")


def check_private(directory: str) -> None:
    """Refuse a record directory another user could write to or swap: it must be a real
    directory (not a symlink), owned by this user, with no group or world access. A record
    says which routes to put back, so one written by someone else could open a namespace on
    `restore` (docs/netcut.md#the-record-directory)."""
    try:
        st = os.lstat(directory)
    except OSError as exc:
        raise state_error(directory, exc, "check it") from None
    why = None
    if not stat.S_ISDIR(st.st_mode):
        why = "is not a directory (a symlink?)"
    elif st.st_uid != os.geteuid():
        why = f"is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    elif st.st_mode & 0o077:
        why = f"is open to others (mode {stat.S_IMODE(st.st_mode):04o}, needs 0700)"
    if why is not None:
        raise StateError(
            f"state directory {directory} {why}; refusing to keep records there: remove it,"
            f" or {_STATE_FIX}"
        )


def checked_default() -> str | None:
    """The directory `check_private` guards: a non-root user's default one."""
    return None if os.geteuid() == 0 else user_state_dir()


_boot_id: str | None = None


def boot_id() -> str:
    """This boot's id (empty where the kernel does not say); read once per process."""
    global _boot_id
    if _boot_id is None:
        try:
            with open(BOOT_ID_PATH) as f:
                _boot_id = f.read().strip()
        except OSError:
            _boot_id = ""
    return _boot_id


def state_error(directory: str, exc: OSError, doing: str) -> StateError:
    why = exc.strerror or str(exc)
    hint = f"${STATE_DIR_ENV}"
    if isinstance(exc, PermissionError) or exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        hint = _STATE_FIX
    return StateError(f"state directory {directory}: cannot {doing}: {why} ({hint})")


__all__ = [
    "BOOT_ID_PATH",
    "DEFAULT_STATE_DIR",
    "STATE_DIR_ENV",
    "boot_id",
    "check_private",
    "checked_default",
    "state_dir",
    "state_error",
    "user_state_dir",
]

"""`LogFile`: the audit log file on disk, as the writer thread holds it.

Shell. Opened for append (mode 0600) and identified by (st_dev, st_ino), so a removed or
replaced path is noticed before the next write; the last line read back at start, to link
a new run's chain to it; appends that report how much got through; rotation on disk:
`PATH.N` shift up, `PATH` becomes `PATH.1`, then `PATH.1.gz` (names from
`format.rotated_name`; docs/audit-log.md). What to write and when is `writer.py`'s.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import gzip
import os
import shutil
from typing import Final

from egress.audit.format import rotated_name

_TAIL_PROBE: Final = 65536  # bytes read back at start to find the file's last line
# the reserve is topped up once this much of it was used: a fallocate costs tens of
# microseconds on ext4, so one per 64 KiB of log (~150 records), not one per write
_TOPUP_STEP: Final = 65536
_FALLOC_FL_KEEP_SIZE: Final = 1  # linux/falloc.h: allocate blocks past the end, size unchanged


def _fallocate() -> object | None:
    """libc's `fallocate` (Linux), or None: `os.posix_fallocate` would change the size."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        func = ctypes.CDLL(name, use_errno=True).fallocate
    except (OSError, AttributeError):
        return None
    func.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
    func.restype = ctypes.c_int
    return func


_FALLOCATE = _fallocate()


class LogFile:
    """The file the writer appends to (`path` "-" is the process's stdout)."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.fd: int | None = None
        self.ident: tuple[int, int] | None = None  # (st_dev, st_ino) of the open file
        self.size = 0  # bytes in the open file
        self.reserved = 0  # the file's blocks are allocated up to this offset (`reserve`)

    def open_stdout(self) -> None:
        self.fd = os.dup(1)  # the process stdout, whatever sys.stdout was replaced by

    def open(self) -> None:
        """Open (create) `path` for append; raises OSError."""
        assert self.path is not None
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        st = os.fstat(fd)
        self.fd, self.ident, self.size = fd, (st.st_dev, st.st_ino), st.st_size
        self.reserved = 0

    def reserve(self, headroom: int) -> bool:
        """Allocate the file's blocks up to `headroom` bytes past its end, its size unchanged
        (fallocate with FALLOC_FL_KEEP_SIZE), so that many bytes of appends cannot meet a
        full disk (docs/audit-log.md#when-the-log-cannot-be-written). False when the file
        system cannot (no fallocate: nothing is reserved); raises OSError (ENOSPC: the disk
        is full)."""
        func = _FALLOCATE
        if func is None or self.fd is None:
            return False
        want = self.size + headroom
        if self.reserved >= want - min(_TOPUP_STEP, headroom // 2):
            return True  # one call per step of log written, not one per write
        start = max(self.reserved, self.size)  # only what the last writes used up: cheap
        result = func(self.fd, _FALLOC_FL_KEEP_SIZE, start, want - start)  # type: ignore[operator]
        if result != 0:
            code = ctypes.get_errno()
            if code in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL, errno.ENODEV):
                return False
            raise OSError(code, os.strerror(code))
        self.reserved = want
        return True

    def headroom(self) -> int:
        """Bytes that can still be appended into blocks already allocated."""
        return max(0, self.reserved - self.size)

    def release_reserve(self) -> None:
        """Give back the blocks allocated past the end (before a rotation or at close)."""
        if self.reserved > self.size and self.fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, self.size)
        self.reserved = 0

    def tail(self) -> bytes:
        """The end of the file as opened (its last line, whole or half), b"" if empty."""
        if not self.size:
            return b""
        assert self.path is not None
        with open(self.path, "rb") as reader:
            reader.seek(max(0, self.size - _TAIL_PROBE))
            return reader.read()

    def replaced(self) -> bool:
        """True when the path no longer names the file we hold open (removed, replaced)."""
        if self.path == "-" or self.ident is None:
            return False
        assert self.path is not None
        try:
            st = os.stat(self.path)
        except OSError:
            return True
        return (st.st_dev, st.st_ino) != self.ident

    def write(self, data: bytes | memoryview) -> tuple[int, OSError | None]:
        """Append all of `data`: (bytes written, the error that stopped it or None)."""
        assert self.fd is not None
        written = 0
        try:
            while written < len(data):
                written += os.write(self.fd, data[written:])
        except OSError as exc:
            self.size += written
            return written, exc
        self.size += written
        return written, None

    def close(self) -> None:
        self.release_reserve()
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None

    def rotate(self) -> None:
        """PATH -> PATH.1 (older ones shift up), then a new, empty PATH; raises OSError
        (the file may then be closed: `fd` None)."""
        assert self.path is not None
        assert self.fd is not None
        self.release_reserve()
        os.close(self.fd)
        self.fd = None
        _shift_rotated(self.path)
        os.rename(self.path, rotated_name(self.path, 1, compressed=False))
        self.open()

    def prune(self, keep: int) -> None:
        """Remove the rotated files numbered above `keep` (the oldest); raises OSError."""
        assert self.path is not None
        index = keep + 1
        while True:
            found = False
            for compressed in (True, False):
                name = rotated_name(self.path, index, compressed=compressed)
                if os.path.exists(name):
                    os.unlink(name)
                    found = True
            if not found:
                return
            index += 1

    def compress_rotated(self) -> None:
        """PATH.1 -> PATH.1.gz; raises on failure (PATH.1 then stays: readers accept both)."""
        assert self.path is not None
        _gzip_file(rotated_name(self.path, 1, compressed=False))


def _shift_rotated(path: str) -> None:
    top = 1
    while any(os.path.exists(rotated_name(path, top, compressed=c)) for c in (True, False)):
        top += 1
    for index in range(top - 1, 0, -1):
        for compressed in (True, False):
            source = rotated_name(path, index, compressed=compressed)
            if os.path.exists(source):
                os.rename(source, rotated_name(path, index + 1, compressed=compressed))


def _gzip_file(source: str) -> None:
    temporary = f"{source}.gz.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    # Level 1: JSON lines still shrink several times over, at a fraction of level 6's CPU.
    with (
        open(source, "rb") as reader,
        open(fd, "wb") as raw,
        gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1) as writer,
    ):
        shutil.copyfileobj(reader, writer, 1024 * 1024)
    os.rename(temporary, f"{source}.gz")
    os.unlink(source)


__all__ = ["LogFile"]

"""Following a live audit log for `egress audit tail -f`: `tail -F` across rotation.

Strategy: a `Follower` reads complete lines appended to a growing file and survives rename
and copytruncate rotation; a `GapFiller` keeps what it shows continuous when the log rotated
more than once between two polls, fetching the missed lines from the rotated files
(docs/audit-log.md). Rotated file names are `format.rotated_name`'s.
"""

from __future__ import annotations

import contextlib
import os
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Final

from egress.audit.format import rotation_of
from egress.audit.read import GZIP_MAGIC, InputError, Line, open_log, parse_record

READ_CHUNK: Final = 1024 * 1024  # bytes a Follower reads at a time


class Follower:
    """Reads complete lines appended to `path`, surviving rotation (rename or truncate),
    like `tail -F`: after a rename it finishes the old file, then opens the new one."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stream: IO[bytes] | None = None
        self._ident: tuple[int, int] | None = None
        self._partial = b""
        self._number = 0  # lines read from the file now open (for FILE:LINE in warnings)

    def read(self) -> list[bytes]:
        """New complete lines (without newlines); [] when nothing new."""
        return [line.data for line in self.read_lines()]

    def read_lines(self) -> list[Line]:
        """New complete lines with where they were read (`PATH:N`; the rest of a file
        renamed away by a rotation is `PATH (rotated):N`); [] when nothing new."""
        if self._stream is None and not self._open():
            return []
        assert self._stream is not None
        data = self._stream.read(READ_CHUNK)
        if data:
            return self._split(data, self.path)
        if self._rotated():
            # Lines may have landed in the old file between our read and the rename.
            rest = self._split(self._stream.read(), f"{self.path} (rotated)")
            self._close()
            self._open()
            return rest + self.read_lines()
        return []

    def _split(self, data: bytes, name: str) -> list[Line]:
        chunks = (self._partial + data).split(b"\n")
        self._partial = chunks.pop()
        first, self._number = self._number + 1, self._number + len(chunks)
        return [Line(name, first + i, chunk, True) for i, chunk in enumerate(chunks)]

    def _open(self) -> bool:
        try:
            stream = open(self.path, "rb")
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise InputError(f"cannot read {self.path}: {exc.strerror or exc}") from None
        if stream.peek(2)[:2] == GZIP_MAGIC:
            stream.close()
            raise InputError(f"cannot follow compressed file {self.path}")
        st = os.fstat(stream.fileno())
        self._stream, self._ident, self._partial = stream, (st.st_dev, st.st_ino), b""
        self._number = 0
        return True

    def _rotated(self) -> bool:
        assert self._stream is not None
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False  # renamed away, the new file not created yet: wait for it
        if (st.st_dev, st.st_ino) != self._ident:
            return True
        if st.st_size < self._stream.tell():  # truncated in place (copytruncate)
            self._stream.seek(0)
            self._partial = b""
            self._number = 0
        return False

    def _close(self) -> None:
        if self._stream is not None:
            self._stream.close()
        self._stream = None

    def close(self) -> None:
        self._close()


def _rotated_now(path: str) -> list[str]:
    """PATH's rotated files as one directory listing has them, newest first (by number:
    probing `PATH.1`, `PATH.2`, ... one by one stops at the hole a shift leaves)."""
    directory = os.path.dirname(path) or "."
    found: list[tuple[int, str]] = []
    for name in os.listdir(directory):
        full = os.path.join(directory, name)
        rotation = rotation_of(full)
        if rotation is not None and rotation[0] == path:
            found.append((rotation[1], full))
    return [name for _, name in sorted(found)]


def rotated_history(path: str) -> Iterator[Line]:
    """The lines of PATH's rotated files, oldest first (for `tail -f PATH`): every file of one
    listing is opened before any is read, so a writer shifting names meanwhile cannot make
    us skip one (a listing whose file vanished before it was opened is taken again)."""
    streams: list[tuple[str, IO[bytes]]] = []
    for _ in range(FILL_ATTEMPTS):
        for _name, stream in streams:
            stream.close()
        streams = []
        try:
            for name in reversed(_rotated_now(path)):
                streams.append((name, open_log(name)))
            break
        except FileNotFoundError:
            continue
        except InputError as exc:  # open_log's "cannot read": a file renamed away
            if "No such file" not in str(exc):
                raise
    try:
        for name, stream in streams:
            with contextlib.suppress(EOFError, OSError, zlib.error):
                for number, raw in enumerate(stream, 1):
                    yield Line(name, number, raw.rstrip(b"\n"), raw.endswith(b"\n"))
    finally:
        for _name, stream in streams:
            stream.close()


def recover_rotated(path: str, lo: int, hi: int) -> list[bytes]:
    """The lines with `lo <= seq <= hi` found in PATH's rotated files (any order).

    For a follower that was too slow: the log rotated more than once between two polls, so
    whole files went by unread. Best effort: the writer may be renaming files meanwhile (each
    file is read through the one descriptor that judged it; a file renamed between the
    listing and its opening is missed, and the caller tries again).
    """
    lines: list[bytes] = []
    try:
        for name in _rotated_now(path):
            try:
                first = _collect(name, lo, hi, lines)
            except FileNotFoundError:
                continue
            if first is None or first <= lo:
                break  # older files hold nothing we need
    except (InputError, OSError, EOFError, zlib.error):
        pass
    return lines


def _collect(name: str, lo: int, hi: int, into: list[bytes]) -> int | None:
    """Append `name`'s lines with `lo <= seq <= hi` to `into`; its first line's seq."""
    with open_log(name) as stream:
        head = stream.readline().rstrip(b"\n")
        record = parse_record(head)
        first = record.get("seq") if record else None
        if not isinstance(first, int):
            return None
        if first > hi:
            return first  # newer than the gap
        for raw in (head, *stream):
            data = raw.rstrip(b"\n")
            record = parse_record(data)
            seq = record.get("seq") if record else None
            if isinstance(seq, int) and lo <= seq <= hi:
                into.append(data)
        return first


FILL_ATTEMPTS: Final = 5  # listings of the rotated files while the writer may be renaming them
FILL_PAUSE: Final = 0.02  # seconds between reads: a shift of many files takes a moment
# A gap's fill reads the rotated files again while they change, for at most this long (a
# burst of hundreds of rotations on a loaded machine kept them changing for over a second)
FILL_BUDGET: Final = 5.0


def _snapshot(path: str) -> tuple[tuple[str, int, int], ...]:
    """PATH's rotated files with their inode and size: equal twice in a row, they settled."""
    out: list[tuple[str, int, int]] = []
    for name in _rotated_now(path):
        with contextlib.suppress(OSError):
            st = os.stat(name)
            out.append((name, st.st_ino, st.st_size))
    return tuple(out)


class GapFiller:
    """Keeps a followed log continuous: when a `rotate` (or `reopen`) record arrives with a
    `seq` past the next one expected, the lines in between are fetched from the rotated files
    first; lines already shown (a file read twice across a rotation or a copytruncate) are
    not shown again. What cannot be found is reported with its exact `seq` ranges.

    `from_start`: everything of the log is wanted (`tail -f PATH` with no history read yet),
    so a first record that is a `rotate` with `seq` N means lines 0..N-1 went into rotated
    files before the follower opened PATH (PATH did not exist yet when `tail` started, or
    rotated between the listing of its rotated files and its opening): they are fetched too."""

    def __init__(self, path: str, warn: Callable[[str], None], *, from_start: bool = False) -> None:
        self.path = path
        self.warn = warn
        self.last: int | None = None
        self.from_start = from_start

    def feed(self, lines: Iterable[bytes]) -> Iterator[bytes]:
        for data in lines:
            record = parse_record(data)
            seq = record.get("seq") if record else None
            if not isinstance(seq, int) or record is None:
                yield data
                continue
            kind = record.get("type")
            if kind == "start":
                self.last = None  # a new run: its seq starts again at 0
            elif self.last is not None and seq <= self.last:
                continue  # already shown
            expected = self.last + 1 if self.last is not None else 0 if self.from_start else None
            if kind in ("rotate", "reopen") and expected is not None and seq > expected:
                yield from self._fill(expected, seq - 1)
            self.from_start = False  # only the first record can follow nothing shown
            self.last = seq
            yield data

    def _fill(self, lo: int, hi: int) -> list[bytes]:
        # The writer may be shifting and compressing files as we read them: read again
        # while they change (up to FILL_BUDGET); a line still missing from a settled set of
        # files is gone (removed by `keep`), and waiting longer would only fall behind.
        found: dict[int, bytes] = {}
        deadline = time.monotonic() + FILL_BUDGET
        seen: tuple[tuple[str, int, int], ...] | None = None
        while True:
            files = _snapshot(self.path)
            for data in recover_rotated(self.path, lo, hi):
                record = parse_record(data)
                seq = record.get("seq") if record else None
                if isinstance(seq, int):
                    found.setdefault(seq, data)
            if len(found) == hi - lo + 1 or files == seen or time.monotonic() > deadline:
                break
            seen = files
            time.sleep(FILL_PAUSE)
        missing = [seq for seq in range(lo, hi + 1) if seq not in found]
        if missing:
            self.warn(
                f"{self.path} rotated faster than it was read: {len(missing)} line(s) "
                f"(seq {_ranges(missing)}) not found in its rotated files"
            )
        return [found[seq] for seq in sorted(found)]


def _ranges(seqs: list[int]) -> str:
    """`3..5, 9, 12..13` for [3, 4, 5, 9, 12, 13] (sorted)."""
    parts: list[str] = []
    start = prev = seqs[0]
    for seq in [*seqs[1:], None]:
        if seq is not None and seq == prev + 1:
            prev = seq
            continue
        parts.append(f"{start}..{prev}" if prev != start else str(start))
        if seq is not None:
            start = prev = seq
    return ", ".join(parts)

"""Following a live audit log for `egress audit tail -f`: `tail -F` across rotation.

Strategy: a `Follower` reads complete lines appended to a growing file and survives rename
and copytruncate rotation; a `GapFiller` keeps what it shows continuous when the log rotated
more than once between two polls, fetching the missed lines from the rotated files
(docs/audit-log.md). Rotated file names are `format.rotated_name`'s.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Final

from egress.audit.format import rotated_name
from egress.audit.read import GZIP_MAGIC, InputError, open_log, parse_record, read_lines

READ_CHUNK: Final = 1024 * 1024  # bytes a Follower reads at a time


class Follower:
    """Reads complete lines appended to `path`, surviving rotation (rename or truncate),
    like `tail -F`: after a rename it finishes the old file, then opens the new one."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stream: IO[bytes] | None = None
        self._ident: tuple[int, int] | None = None
        self._partial = b""

    def read(self) -> list[bytes]:
        """New complete lines (without newlines); [] when nothing new."""
        if self._stream is None and not self._open():
            return []
        assert self._stream is not None
        data = self._stream.read(READ_CHUNK)
        if data:
            return self._split(data)
        if self._rotated():
            # Lines may have landed in the old file between our read and the rename.
            rest = self._split(self._stream.read())
            self._close()
            self._open()
            return rest + self.read()
        return []

    def _split(self, data: bytes) -> list[bytes]:
        chunks = (self._partial + data).split(b"\n")
        self._partial = chunks.pop()
        return chunks

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
        return False

    def _close(self) -> None:
        if self._stream is not None:
            self._stream.close()
        self._stream = None

    def close(self) -> None:
        self._close()


def rotated_files(path: str, limit: int = 1000) -> Iterator[str]:
    """`PATH.1.gz` (or `PATH.1`), `PATH.2.gz`, ...: the rotated files, newest first."""
    for index in range(1, limit):
        names = (rotated_name(path, index), rotated_name(path, index, compressed=False))
        name = next((n for n in names if os.path.exists(n)), None)
        if name is None:
            return
        yield name


def _first_seq(name: str) -> int | None:
    with open_log(name) as stream:
        record = parse_record(stream.readline().rstrip(b"\n"))
    seq = record.get("seq") if record else None
    return seq if isinstance(seq, int) else None


def recover_rotated(path: str, lo: int, hi: int) -> list[bytes]:
    """The lines with `lo <= seq <= hi` from PATH's rotated files, oldest first.

    For a follower that was too slow: the log rotated more than once between two polls, so
    whole files went by unread. Best effort (the writer may be renaming files meanwhile);
    the caller compares what came back with what it expected.
    """
    needed: list[str] = []
    try:
        for name in rotated_files(path):
            needed.append(name)
            first = _first_seq(name)
            if first is None or first <= lo:
                break
        lines = []
        for line in read_lines(reversed(needed), lambda _path, _why: None):
            record = parse_record(line.data)
            seq = record.get("seq") if record else None
            if isinstance(seq, int) and lo <= seq <= hi:
                lines.append(line.data)
        return lines
    except (InputError, OSError, EOFError, zlib.error):
        return []


FILL_ATTEMPTS: Final = 3  # reads of the rotated files while the writer may be renaming them


class GapFiller:
    """Keeps a followed log continuous: when a `rotate` (or `reopen`) record arrives with a
    `seq` past the next one expected, the lines in between are fetched from the rotated files
    first; lines already shown (a file read twice across a rotation or a copytruncate) are
    not shown again. What cannot be found is reported with its exact `seq` ranges."""

    def __init__(self, path: str, warn: Callable[[str], None]) -> None:
        self.path = path
        self.warn = warn
        self.last: int | None = None

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
            if kind in ("rotate", "reopen") and self.last is not None and seq > self.last + 1:
                yield from self._fill(self.last + 1, seq - 1)
            self.last = seq
            yield data

    def _fill(self, lo: int, hi: int) -> list[bytes]:
        found: dict[int, bytes] = {}
        for _ in range(FILL_ATTEMPTS):  # the writer may have shifted files while we read
            for data in recover_rotated(self.path, lo, hi):
                record = parse_record(data)
                seq = record.get("seq") if record else None
                if isinstance(seq, int):
                    found.setdefault(seq, data)
            if len(found) == hi - lo + 1:
                break
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

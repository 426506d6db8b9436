"""The audit writer's backlog: chained lines not yet in the file, bounded in bytes
(docs/audit-log.md#when-the-log-cannot-be-written).

Strategy: lines wait here while the file cannot be written; beyond `max_bytes` the oldest
whole line is given up (never the first, which may be half written: its written part is
`head_written`), and the writer counts it lost, so the gap is visible to `verify`. A write
that stopped mid-way keeps whole lines: the first one not fully written stays with its
offset, so a file reopened then gets it whole. Owned by the writer thread: no lock.
"""

from __future__ import annotations

from collections import deque


class Backlog:
    """Chained lines, each ending in `\\n`, in the order they are to be written."""

    def __init__(self, max_bytes: int) -> None:
        self.chunks: deque[bytes] = deque()
        self.size = 0  # bytes waiting
        self.head_written = 0  # bytes of chunks[0] already in the file (a partial write)
        self.max_bytes = max_bytes

    def __bool__(self) -> bool:
        return bool(self.chunks)

    def push(self, data: bytes) -> int:
        """Append `data`; returns how many lines were given up to stay within `max_bytes`."""
        self.chunks.append(data)
        self.size += len(data)
        dropped = 0
        while self.size > self.max_bytes and len(self.chunks) > 2:
            # Drop the oldest whole line (never the head, which may be half written).
            head = self.chunks.popleft()
            self.size -= len(self.chunks.popleft())
            self.chunks.appendleft(head)
            dropped += 1
        return dropped

    def take(self) -> tuple[bytes, int]:
        """Everything waiting, joined, and how many of its bytes the file already has; the
        backlog is empty after."""
        data, skip = b"".join(self.chunks), self.head_written
        self.chunks.clear()
        self.size = self.head_written = 0
        return data, skip

    def keep(self, data: bytes, skip: int, done: int) -> int:
        """`data` (from `take`) was written up to byte `done`: keep what was not, from the
        start of the first line not fully written; returns the lines written whole."""
        start = data.rfind(b"\n", 0, done) + 1
        if start < len(data):
            self.chunks.append(data[start:])
        self.size = len(data) - start
        self.head_written = done - start
        return data.count(b"\n", skip, done)

    def lines(self) -> int:
        return sum(chunk.count(b"\n") for chunk in self.chunks)


__all__ = ["Backlog"]

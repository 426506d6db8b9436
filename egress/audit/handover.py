"""The hand-over from the event loop to the audit writer thread: what the queue carries, how
the writer takes it in batches, and what is left in it after the writer stopped.

Strategy: `AuditLog.record()` puts serialized lines (or a list of them, one per loop
iteration), `DROPPED` for a line the full backlog refused, a `Future` for `flush()` and `STOP`
for `aclose()` on a `queue.SimpleQueue`; the writer joins what is queued into batches of at
most `BATCH_LINES`, so one wake-up writes many lines.
"""

from __future__ import annotations

import concurrent.futures
import queue
from typing import Final

BATCH_LINES: Final = 8192  # lines joined into one write at most

DROPPED: Final = object()  # queued instead of a line when the backlog is full
STOP: Final = object()  # queued by aclose(): write the end record and stop


def take_batch(source: queue.SimpleQueue[object], timeout: float | None) -> list[object] | None:
    """What is queued, up to `BATCH_LINES` lines, waiting up to `timeout` for the first item;
    None when nothing came in that time."""
    try:
        item = source.get(timeout=timeout)
    except queue.Empty:
        return None
    batch: list[object] = []
    while True:
        # the event loop hands over a list of lines per loop iteration (one wake-up)
        if isinstance(item, list):
            batch.extend(item)
        else:
            batch.append(item)
        if len(batch) >= BATCH_LINES:
            return batch
        try:
            item = source.get_nowait()
        except queue.Empty:
            return batch


def lines_in(items: list[object]) -> int:
    """The lines among `items` (a `DROPPED` one counts: it had a `seq`)."""
    return sum(isinstance(i, str) or i is DROPPED for i in items)


def release_waiters(batch: list[object]) -> None:
    """Wake the `flush()` callers whose futures the batch carried."""
    for item in batch:
        if isinstance(item, concurrent.futures.Future) and not item.done():
            item.set_result(None)


def abandon_queued(source: queue.SimpleQueue[object]) -> int:
    """Empty `source` after the writer stopped: release flush() waiters, and count the lines
    that raced with aclose() (or outlived a crashed thread); they are never written."""
    abandoned = 0
    while True:
        try:
            item = source.get_nowait()
        except queue.Empty:
            return abandoned
        if isinstance(item, concurrent.futures.Future):
            item.set_result(None)
        elif isinstance(item, list):  # a loop-side batch of lines
            abandoned += len(item)
        elif item is not STOP:
            abandoned += 1


__all__ = [
    "BATCH_LINES",
    "DROPPED",
    "STOP",
    "abandon_queued",
    "lines_in",
    "release_waiters",
    "take_batch",
]

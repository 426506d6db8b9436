"""The audit log writer that the proxy calls for every request or tunnel.

Strategy: `AuditLog.record()` runs on the proxy's event loop for every event, so it does
only CPU work that costs a few microseconds: copy the event, add `ts`, redact, serialize
(`format.py`), and hand the text to one writer thread through a `queue.SimpleQueue`. The
writer thread (`auditwriter`) owns everything else: the hash chain (`seq`, `prev`), batching
the lines already queued into one `os.write`, rotation and gzip, noticing that the file was
removed, retrying while it cannot write, and the start/end/rotate/loss records. The event
loop never touches the file after `start()`.

Failure policy: a failed write is logged at ERROR (logger `egress.audit`, which reaches
stderr even when logging is not configured) and counted in `write_errors`; the lines stay
queued and are retried every `retry_interval` seconds; `outage` and `recovered` records mark
the outage in the chain. With `fail_mode="closed"`, `accepting` is False while the log cannot
be written and the proxy refuses every request and tunnel (reason `audit_unavailable`); with
`"open"` it keeps serving. Lines are never dropped silently: a line that cannot be kept
still takes its place in the chain, so `egress audit verify` reports the gap, and a `loss`
record says how many were lost once writing resumes; lines left unwritten at close are
`lines_abandoned` (and `egress serve` exits 1).

Memory bounds: at most `max_backlog` lines wait for the writer thread and at most
`max_pending_bytes` of chained lines wait for a writable file (beyond either, lines are
lost as above); each `events()` consumer holds at most `events_maxlen` events.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import math
import queue
import threading
from collections.abc import AsyncIterator
from json.encoder import encode_basestring_ascii
from types import TracebackType
from typing import Final, Literal

from egress.audit.deliver import Delivery, Hook
from egress.audit.format import Clock, encode_record
from egress.audit.redact import Redactor
from egress.audit.writer import CLOSE_TIMEOUT, DROPPED, STOP, LogWriter, abandon_queued
from egress.validate import as_bool, as_choice, as_count, as_timeout

logger = logging.getLogger("egress.audit")

FailMode = Literal["open", "closed"]

# A slow disk must not grow memory without bound. 1 M queued lines of ~300 bytes is ~0.3 GB
# only in the worst case; in practice the writer drains a batch per write.
DEFAULT_MAX_BACKLOG: Final = 1_000_000
DEFAULT_MAX_PENDING_BYTES: Final = 64 * 1024 * 1024  # lines kept while the file is unwritable
DEFAULT_RETRY_INTERVAL: Final = 0.5  # seconds between attempts to write an unwritable log
DEFAULT_EVENTS_MAXLEN: Final = 1024  # events buffered per events() consumer
DEFAULT_INTERIM_INTERVAL: Final = 60.0  # seconds between a long tunnel's progress records
# closed mode: bytes kept allocated past the end of the file, so that what the proxy admitted
# before the disk filled is recorded (docs/audit-log.md#when-the-log-cannot-be-written):
# 8 KiB for each of the default 1,024 connections' exchanges in flight
RESERVE_PER_EXCHANGE: Final = 8192
DEFAULT_RESERVE_BYTES: Final = 1024 * RESERVE_PER_EXCHANGE


class AuditLog:
    """JSON Lines audit log with a hash chain; see docs/audit-log.md.

    `path` is a file (appended to; a new run starts with a start record), `"-"` for
    stdout, or None for no file at all (hooks and `events()` only). `rotate_bytes` rotates
    the file to `PATH.1.gz` (older ones shift to `.2.gz`, ...) before it would exceed that
    size; the chain continues in the new file; `keep` rotated files are kept (None: all).
    `interim_interval`: seconds between the `progress` records of a long tunnel (the proxy
    reads it). Usable as `async with AuditLog(...) as log:`.
    Raises ValueError for a bad `fail_mode`, `rotate_bytes`, `keep` or `interim_interval`.
    """

    def __init__(
        self,
        path: str | None,
        *,
        fail_mode: FailMode = "open",
        keep_query: bool = False,
        rotate_bytes: int | None = None,
        keep: int | None = None,
        interim_interval: float = DEFAULT_INTERIM_INTERVAL,
        retry_interval: float = DEFAULT_RETRY_INTERVAL,
        max_backlog: int = DEFAULT_MAX_BACKLOG,
        max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
        events_maxlen: int = DEFAULT_EVENTS_MAXLEN,
        close_timeout: float = CLOSE_TIMEOUT,
        worker: tuple[int, int] | None = None,
        reserve_bytes: int | None = None,
    ) -> None:
        _check_args(
            path,
            fail_mode,
            keep_query,
            rotate_bytes,
            retry_interval,
            close_timeout,
            max_backlog=max_backlog,
            max_pending_bytes=max_pending_bytes,
            events_maxlen=events_maxlen,
        )
        if keep is not None:
            as_count(keep, "AuditLog keep")  # 0 would delete every rotated file
        as_timeout(interim_interval, "AuditLog interim_interval")
        if reserve_bytes is None:
            reserve_bytes = DEFAULT_RESERVE_BYTES if fail_mode == "closed" else 0
        as_count(reserve_bytes, "AuditLog reserve_bytes", minimum=0)
        self.path = path
        self.fail_mode: FailMode = fail_mode
        self.keep_query = keep_query
        self.rotate_bytes = rotate_bytes if path not in (None, "-") else None
        self.events_maxlen = events_maxlen
        self.interim_interval = float(interim_interval)
        self._links = 0  # the last link id given (`opened`)
        self._clock = Clock()
        self._redactor = Redactor(keep_query)
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._max_backlog = max_backlog
        self._enqueued = 0
        self._batch: list[object] = []  # lines of the current loop iteration
        self._writer = LogWriter(
            path,
            fail_mode=fail_mode,
            keep_query=keep_query,
            rotate_bytes=self.rotate_bytes,
            retry_interval=retry_interval,
            max_pending_bytes=max_pending_bytes,
            close_timeout=close_timeout,
            clock=self._clock,
            keep=keep,
            reserve_bytes=reserve_bytes,
        )
        if worker is not None:  # docs/audit-log.md#several-workers: verify checks them
            index, count = _check_worker(worker)
            self._writer.start_fields = {"worker": index, "workers": count}
        self._thread: threading.Thread | None = None
        self._delivery = Delivery(events_maxlen)  # hooks and events() consumers
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._closed = False
        self._serialize = path is not None

    # -- counters and state, read from any thread ----------------------------------------

    @property
    def write_errors(self) -> int:
        """Failed attempts to write (or reopen) the file since start."""
        return self._writer.write_errors

    @property
    def lines_written(self) -> int:
        """Lines written to the file, control records (start, rotate, end) included."""
        return self._writer.lines_written

    @property
    def lines_dropped(self) -> int:
        """Lines that could not be kept (backlog or pending limit); verify shows the gap."""
        return self._writer.lines_dropped + self._writer.lines_abandoned

    @property
    def lines_abandoned(self) -> int:
        """Lines never written and never reported in the file: left at close (the disk
        still full after `close_timeout`) or recorded after it. `egress serve` exits 1."""
        return self._writer.lines_abandoned

    @property
    def writable(self) -> bool:
        """False while the last attempt to write the file failed."""
        return self._writer.writable

    @property
    def accepting(self) -> bool:
        """False when fail_mode is "closed" and the log cannot currently be written.

        The proxy checks it before every request and tunnel, kept-alive or not, and refuses
        with reason `audit_unavailable` when False (docs/audit-log.md).
        """
        return self.fail_mode == "open" or self._writer.writable

    @property
    def run_id(self) -> str:
        """The random id of this run, in its start record."""
        return self._writer.run_id

    @property
    def events_dropped(self) -> int:
        """Events an `events()` consumer lost by falling `events_maxlen` behind."""
        return self._delivery.events_dropped

    @property
    def hook_errors(self) -> int:
        """Hooks that raised (or whose task failed); logged, never raised."""
        return self._delivery.hook_errors

    @property
    def head(self) -> str:
        """SHA-256 of the last line chained so far; keep it out of band to anchor verify."""
        return self._writer.prev

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Open the file and write the start record.

        Raises OSError when the file cannot be opened at all: a configuration error found
        before any traffic. Failures after start follow `fail_mode`.
        """
        if self._loop is not None:
            raise RuntimeError("AuditLog.start() called twice")
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._delivery.loop, self._delivery.loop_thread = self._loop, self._loop_thread
        if self.path is None:
            return
        await asyncio.to_thread(self._writer.open_initial)
        self._thread = threading.Thread(
            target=self._writer.run, args=(self._queue,), name="egress-audit-writer", daemon=True
        )
        self._thread.start()

    def _hand_over(self) -> None:
        if self._batch:
            batch, self._batch = self._batch, []
            self._queue.put(batch)

    async def flush(self) -> None:
        """Wait until every line recorded so far has been handed to the OS (or failed)."""
        self._hand_over()
        if self._thread is None or not self._thread.is_alive():
            return
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._queue.put(done)
        await asyncio.wrap_future(done)

    async def aclose(self) -> None:
        """Flush, write the end record `{"type": "end", "lines": N}`, stop the thread."""
        if self._closed:
            return
        self._closed = True
        self._hand_over()
        if self._thread is not None:
            self._queue.put(STOP)
            await asyncio.to_thread(self._thread.join)
            self._writer.lines_abandoned += abandon_queued(self._queue)  # if the thread died
        elif self._serialize:  # never started: whatever was recorded is not written
            self._writer.lines_abandoned += self._enqueued
        await self._delivery.close()

    async def __aenter__(self) -> AuditLog:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- the hot path --------------------------------------------------------------------

    def record(self, event: dict[str, object]) -> None:
        """Log one event. Never blocks, never raises, never does I/O.

        Adds `ts` when missing, drops secret-named fields, redacts query strings, serializes
        the line and queues it for the writer thread; then gives the redacted dict to the
        hooks and `events()` consumers (treat it as read-only).
        """
        if self._closed:
            self._writer.lines_abandoned += 1
            return
        rec: dict[str, object] = {"ts": None, **event}
        if rec["ts"] is None:
            rec["ts"] = self._clock.now()
        self._redactor.redact(rec)
        if self._serialize:  # inline, not a method: this runs tens of thousands of times/s
            item: object
            if self._enqueued - self._writer.dequeued < self._max_backlog:
                try:
                    item = encode_record(rec)
                except (ValueError, TypeError, RecursionError):
                    item = json.dumps(_plain(rec), separators=(",", ":"))
            else:
                item = DROPPED  # keeps its place in the chain: verify shows the gap
            self._enqueued += 1
            if threading.get_ident() == self._loop_thread and self._loop is not None:
                # Batch per loop iteration: one queue hand-over (one writer wake-up) for all
                # the lines of an iteration, instead of one per line. Never later than that:
                # a crash may lose only what is being written (docs/audit-log.md).
                if not self._batch:
                    self._loop.call_soon(self._hand_over)
                self._batch.append(item)
            else:
                self._queue.put(item)
        delivery = self._delivery
        if delivery.hooks or delivery.subscribers:
            delivery.deliver(rec)

    def opened(self, event: dict[str, object]) -> int:
        """Record that a tunnel or request reached its upstream: an `open` record with a new
        link `id`, returned; its request record (and its `progress` records) carry the same
        `id`, so a crash never hides that it existed (docs/audit-log.md#open-and-progress).

        Once per request on the hot path, so the line is built here from the proxy's few
        flat fields (`OPEN_FIELDS`, str/int/None: nothing to redact) rather than through
        `record()`'s copy, redaction and encoder; anything else takes `record()`."""
        self._links = link = self._links + 1
        delivery = self._delivery
        if (
            not self._serialize
            or self._closed
            or delivery.hooks
            or delivery.subscribers
            or self._enqueued - self._writer.dequeued >= self._max_backlog
            or threading.get_ident() != self._loop_thread
        ):
            self.record({"type": "open", "id": link, **event})
            return link
        parts = [f'{{"ts":"{self._clock.now()}","type":"open","id":{link}']
        for key, value in event.items():
            prefix = _OPEN_PREFIX.get(key)
            if prefix is None:
                self.record({"type": "open", "id": link, **event})
                return link
            if isinstance(value, str):
                parts.append(prefix + _json_str(value))
            elif value is None:
                parts.append(prefix + "null")
            elif value.__class__ is int:
                parts.append(prefix + str(value))
            else:
                self.record({"type": "open", "id": link, **event})
                return link
        parts.append("}")
        self._enqueued += 1
        if not self._batch and self._loop is not None:
            self._loop.call_soon(self._hand_over)
        self._batch.append("".join(parts))
        return link

    # -- hooks and events() ----------------------------------------------------------------

    def add_hook(self, callback: Hook) -> None:
        """Call `callback(event)` for every recorded event; a coroutine result is scheduled
        as a task. Exceptions are logged and counted in `hook_errors`, never raised."""
        self._delivery.hooks.append(callback)

    def events(self) -> AsyncIterator[dict[str, object]]:
        """Recorded events, from now until `aclose()`. A consumer that falls more than
        `events_maxlen` behind loses the oldest ones (counted in `events_dropped`)."""
        return self._delivery.subscribe(self._closed)


# The fields of an open record that `opened` serializes itself (docs/audit-log.md).
OPEN_FIELDS: Final = ("client", "method", "host", "port", "addr", "client_id", "mode")
_OPEN_PREFIX: Final = {key: f',"{key}":' for key in OPEN_FIELDS}
_json_str: Final = encode_basestring_ascii


def _plain(value: object) -> object:
    """A JSON-safe copy for the rare record the fast encoder refuses (NaN, cycles)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def _check_args(
    path: object,
    fail_mode: object,
    keep_query: object,
    rotate_bytes: object,
    retry_interval: object,
    close_timeout: object,
    **counts: object,
) -> None:
    """Typed arguments (docs/policy.md#types): keep_query="false" would keep query strings."""
    if path is not None and not isinstance(path, str):
        raise TypeError(f"AuditLog path must be a string or None, not {path!r}")
    try:
        as_choice(fail_mode, "fail_mode", ("open", "closed"))
    except TypeError as exc:
        raise ValueError(str(exc)) from None
    as_bool(keep_query, "AuditLog keep_query")
    if rotate_bytes is not None:
        as_count(rotate_bytes, "AuditLog rotate_bytes")
    as_timeout(retry_interval, "AuditLog retry_interval")
    as_timeout(close_timeout, "AuditLog close_timeout")
    for name, value in counts.items():
        as_count(value, f"AuditLog {name}")


def _check_worker(worker: object) -> tuple[int, int]:
    """(index, count) of an `egress serve --workers` worker: 0 <= index < count."""
    if not isinstance(worker, tuple) or len(worker) != 2:
        raise TypeError(f"AuditLog worker must be a tuple (index, count), not {worker!r}")
    index, count = worker
    as_count(count, "AuditLog worker count")
    if as_count(index, "AuditLog worker index", minimum=0) >= count:
        raise ValueError(f"AuditLog worker index {index} must be below the count {count}")
    return index, count

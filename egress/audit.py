"""The audit log writer that the proxy calls for every request or tunnel.

Strategy: `AuditLog.record()` runs on the proxy's event loop for every event, so it does
only CPU work that costs a few microseconds: copy the event, add `ts`, redact, serialize
(`auditfmt`), and hand the text to one writer thread through a `queue.SimpleQueue`. The
writer thread owns everything else: the hash chain (`seq`, `prev`), batching the lines
already queued into one `os.write`, rotation and gzip, noticing that the file was removed,
retrying while it cannot write, and the start/end/rotate/loss records. The event loop never
touches the file after `start()`.

Failure policy: a failed write is logged at ERROR (logger `egress.audit`, which reaches
stderr even when logging is not configured) and counted in `write_errors`; the lines stay
queued and are retried every `retry_interval` seconds. With `fail_mode="closed"`,
`accepting` is False while the log cannot be written and the proxy refuses new connections
(reason `audit_unavailable`); with `"open"` it keeps serving. Lines are never dropped
silently: a line that cannot be kept still takes its place in the chain, so `egress audit
verify` reports the gap, and a `loss` record says how many were lost once writing resumes.

Memory bounds: at most `max_backlog` lines wait for the writer thread and at most
`max_pending_bytes` of chained lines wait for a writable file (beyond either, lines are
lost as above); each `events()` consumer holds at most `events_maxlen` events.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gzip
import inspect
import json
import logging
import math
import os
import queue
import shutil
import sys
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import Final, Literal

from egress.auditfmt import (
    FORMAT,
    GENESIS,
    Clock,
    Redactor,
    chain_line,
    encode_record,
    line_hash,
)

logger = logging.getLogger("egress.audit")

FailMode = Literal["open", "closed"]
Hook = Callable[[dict[str, object]], object]

# A slow disk must not grow memory without bound. 1 M queued lines of ~300 bytes is ~0.3 GB
# only in the worst case; in practice the writer drains a batch per write.
DEFAULT_MAX_BACKLOG: Final = 1_000_000
DEFAULT_MAX_PENDING_BYTES: Final = 64 * 1024 * 1024  # lines kept while the file is unwritable
DEFAULT_RETRY_INTERVAL: Final = 0.5  # seconds between attempts to write an unwritable log
DEFAULT_EVENTS_MAXLEN: Final = 1024  # events buffered per events() consumer
CLOSE_TIMEOUT: Final = 5.0  # aclose() gives an unwritable log this long for the end record
BATCH_LINES: Final = 8192  # lines joined into one write at most
ERROR_LOG_INTERVAL: Final = 10.0  # seconds between repeated "still failing" reports
_TAIL_PROBE: Final = 65536  # bytes read back at start to find the file's last line

_DROPPED: Final = object()  # queued instead of a line when the backlog is full
_STOP: Final = object()


class AuditLog:
    """JSON Lines audit log with a hash chain; see docs/audit-log.md.

    `path` is a file (appended to; a new run starts with a start record), `"-"` for
    stdout, or None for no file at all (hooks and `events()` only). `rotate_bytes` rotates
    the file to `PATH.1.gz` (older ones shift to `.2.gz`, ...) before it would exceed that
    size; the chain continues in the new file. Usable as `async with AuditLog(...) as log:`.
    """

    def __init__(self, path: str | None, *, fail_mode: FailMode = "open",
                 keep_query: bool = False, rotate_bytes: int | None = None,
                 retry_interval: float = DEFAULT_RETRY_INTERVAL,
                 max_backlog: int = DEFAULT_MAX_BACKLOG,
                 max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
                 events_maxlen: int = DEFAULT_EVENTS_MAXLEN,
                 close_timeout: float = CLOSE_TIMEOUT) -> None:
        if fail_mode not in ("open", "closed"):
            raise ValueError(f"fail_mode must be 'open' or 'closed', not {fail_mode!r}")
        if rotate_bytes is not None and rotate_bytes <= 0:
            raise ValueError(f"rotate_bytes must be positive, not {rotate_bytes}")
        self.path = path
        self.fail_mode: FailMode = fail_mode
        self.keep_query = keep_query
        self.rotate_bytes = rotate_bytes if path not in (None, "-") else None
        self.events_maxlen = events_maxlen
        self.events_dropped = 0
        self.hook_errors = 0
        self._clock = Clock()
        self._redactor = Redactor(keep_query)
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._max_backlog = max_backlog
        self._enqueued = 0
        self._writer = _Writer(path, self, retry_interval, max_pending_bytes)
        self._writer.close_timeout = close_timeout
        self._thread: threading.Thread | None = None
        self._hooks: list[Hook] = []
        self._subscribers: list[_Subscriber] = []
        self._tasks: set[asyncio.Task[object]] = set()
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
    def writable(self) -> bool:
        """False while the last attempt to write the file failed."""
        return self._writer.writable

    @property
    def accepting(self) -> bool:
        """False when fail_mode is "closed" and the log cannot currently be written.

        The proxy checks it before serving a new connection (and refuses with reason
        `audit_unavailable` when False).
        """
        return self.fail_mode == "open" or self._writer.writable

    @property
    def run_id(self) -> str:
        """The random id of this run, in its start record."""
        return self._writer.run_id

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
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        if self.path is None:
            return
        await asyncio.to_thread(self._writer.open_initial)
        self._thread = threading.Thread(target=self._writer.run, args=(self._queue,),
                                        name="egress-audit-writer", daemon=True)
        self._thread.start()

    async def flush(self) -> None:
        """Wait until every line recorded so far has been handed to the OS (or failed)."""
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
        if self._thread is not None:
            self._queue.put(_STOP)
            await asyncio.to_thread(self._thread.join)
        for subscriber in self._subscribers:
            subscriber.close()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def __aenter__(self) -> AuditLog:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
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
        rec: dict[str, object] = {"ts": None}
        rec.update(event)
        if rec["ts"] is None:
            rec["ts"] = self._clock.now()
        self._redactor.redact(rec)
        if self._serialize:
            self._enqueue(rec)
        if self._hooks or self._subscribers:
            self._deliver(rec)

    def _enqueue(self, rec: dict[str, object]) -> None:
        if self._enqueued - self._writer.dequeued >= self._max_backlog:
            self._queue.put(_DROPPED)  # keeps its place in the chain: verify shows the gap
        else:
            try:
                body = encode_record(rec)
            except (ValueError, TypeError, RecursionError):
                body = json.dumps(_plain(rec), separators=(",", ":"))
            self._queue.put(body)
        self._enqueued += 1

    # -- hooks and events() ----------------------------------------------------------------

    def add_hook(self, callback: Hook) -> None:
        """Call `callback(event)` for every recorded event; a coroutine result is scheduled
        as a task. Exceptions are logged and counted in `hook_errors`, never raised."""
        self._hooks.append(callback)

    def events(self) -> AsyncIterator[dict[str, object]]:
        """Recorded events, from now until `aclose()`. A consumer that falls more than
        `events_maxlen` behind loses the oldest ones (counted in `events_dropped`)."""
        subscriber = _Subscriber(self)
        self._subscribers.append(subscriber)
        return subscriber.iterate()

    def _deliver(self, rec: dict[str, object]) -> None:
        if threading.get_ident() != self._loop_thread and self._loop is not None:
            self._loop.call_soon_threadsafe(self._deliver_here, rec)
        else:
            self._deliver_here(rec)

    def _deliver_here(self, rec: dict[str, object]) -> None:
        for subscriber in self._subscribers:
            subscriber.put(rec)
        for hook in self._hooks:
            try:
                result = hook(rec)
            except Exception:
                self._hook_failed()
                continue
            if inspect.isawaitable(result):
                try:
                    task = asyncio.ensure_future(result)
                except RuntimeError:  # recorded before start(): no loop to run it on
                    self._hook_failed()
                    continue
                self._tasks.add(task)
                task.add_done_callback(self._hook_done)

    def _hook_done(self, task: asyncio.Future[object]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._hook_failed(task.exception())

    def _hook_failed(self, exc: BaseException | None = None) -> None:
        self.hook_errors += 1
        if self.hook_errors <= 10:
            logger.error("audit hook failed (%d so far)", self.hook_errors,
                         exc_info=exc or True)


class _Subscriber:
    """One events() consumer: a bounded deque that drops its oldest entry when full."""

    def __init__(self, owner: AuditLog) -> None:
        self._owner = owner
        self._items: deque[dict[str, object] | None] = deque()
        self._wakeup = asyncio.Event()

    def put(self, rec: dict[str, object] | None) -> None:
        if rec is not None and len(self._items) >= self._owner.events_maxlen:
            self._items.popleft()
            self._owner.events_dropped += 1
        self._items.append(rec)
        self._wakeup.set()

    def close(self) -> None:
        self.put(None)

    async def iterate(self) -> AsyncIterator[dict[str, object]]:
        try:
            while True:
                while not self._items:
                    self._wakeup.clear()
                    await self._wakeup.wait()
                item = self._items.popleft()
                if item is None:
                    return
                yield item
        finally:
            with contextlib.suppress(ValueError):
                self._owner._subscribers.remove(self)


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


class _Writer:
    """Everything that happens on the writer thread. Counters are read by other threads."""

    def __init__(self, path: str | None, owner: AuditLog, retry_interval: float,
                 max_pending_bytes: int) -> None:
        self.path = path
        self.owner = owner
        self.retry_interval = retry_interval
        self.max_pending_bytes = max_pending_bytes
        self.run_id = os.urandom(16).hex()
        self.clock = Clock()
        self.fd: int | None = None
        self.ident: tuple[int, int] | None = None  # (st_dev, st_ino) of the open file
        self.file_bytes = 0
        self.seq = -1
        self.prev = GENESIS
        self.requests = 0
        self.rotations = 0
        self.pending: deque[bytes] = deque()  # chained lines with "\n", not yet written
        self.pending_bytes = 0
        self.dequeued = 0
        self.write_errors = 0
        self.lines_written = 0
        self.lines_dropped = 0  # lost in this writer, reported by a loss record
        self.lines_abandoned = 0  # recorded after close, or never written at close
        self.loss_reported = 0  # lines_dropped already told in a loss record
        self.writable = True
        self.close_timeout = CLOSE_TIMEOUT
        self._last_error_log = 0.0

    # -- opening ---------------------------------------------------------------------------

    def open_initial(self) -> None:
        """Open the file (raises OSError), link the start record to its last line."""
        if self.path == "-":
            self.fd = os.dup(sys.stdout.fileno())
            return
        assert self.path is not None
        self._open()
        tail = b""
        if self.file_bytes:
            assert self.fd is not None
            with open(self.path, "rb") as reader:
                reader.seek(max(0, self.file_bytes - _TAIL_PROBE))
                tail = reader.read()
        if tail:
            complete = tail.endswith(b"\n")
            last = tail.rstrip(b"\n").rsplit(b"\n", 1)[-1]
            self.prev = line_hash(last)
            if not complete:  # a crashed run left half a line: end it, keep it visible
                self._push(b"\n")

    def _open(self) -> None:
        assert self.path is not None
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        st = os.fstat(fd)
        self.fd, self.ident, self.file_bytes = fd, (st.st_dev, st.st_ino), st.st_size

    def _replaced(self) -> bool:
        """True when the path no longer names the file we hold open (removed, replaced)."""
        if self.path == "-" or self.ident is None:
            return False
        assert self.path is not None
        try:
            st = os.stat(self.path)
        except OSError:
            return True
        return (st.st_dev, st.st_ino) != self.ident

    # -- the thread ------------------------------------------------------------------------

    def run(self, source: queue.SimpleQueue[object]) -> None:
        self._control({"type": "start", "run": self.run_id, "format": FORMAT,
                       "pid": os.getpid(), "fail_mode": self.owner.fail_mode,
                       "keep_query": self.owner.keep_query,
                       "rotate_bytes": self.owner.rotate_bytes})
        self._flush()
        stopping = False
        while not stopping:
            stopping = self._run_batch(source)
        self._finish()

    def _run_batch(self, source: queue.SimpleQueue[object]) -> bool:
        watch = bool(self.pending) or self.owner.fail_mode == "closed"
        try:
            item = source.get(timeout=self.retry_interval if watch else None)
        except queue.Empty:
            self._idle_check()
            return False
        batch = [item]
        while len(batch) < BATCH_LINES:
            try:
                batch.append(source.get_nowait())
            except queue.Empty:
                break
        barriers: list[concurrent.futures.Future[None]] = []
        for item in batch:
            if isinstance(item, str):
                self._line(item)
            elif item is _DROPPED:
                self._lose_next()
            elif isinstance(item, concurrent.futures.Future):
                barriers.append(item)
            elif item is _STOP:
                return True
        self._flush()
        for barrier in barriers:
            barrier.set_result(None)
        return False

    def _idle_check(self) -> None:
        # Retry pending lines; in closed mode also notice a removed file while idle, so
        # the proxy stops accepting before the next connection rather than after it.
        if self.pending:
            self._flush()
        elif (self.fd is None or self._replaced()) and self._reopen():
            self._succeeded()

    def _line(self, body: str) -> None:
        self.dequeued += 1
        self.requests += 1
        self._chain(body)

    def _control(self, fields: dict[str, object]) -> None:
        record: dict[str, object] = {"type": fields.pop("type"), "ts": self.clock.now()}
        record.update(fields)
        self._chain(encode_record(record), may_rotate=record["type"] != "rotate")

    def _chain(self, body: str, *, may_rotate: bool = True) -> None:
        line = chain_line(body, self.seq + 1, self.prev)
        if may_rotate and self._needs_rotation(len(line) + 1):
            self._rotate()
            line = chain_line(body, self.seq + 1, self.prev)
        self.seq += 1
        self.prev = line_hash(line)
        self._push(line + b"\n")

    def _needs_rotation(self, size: int) -> bool:
        limit = self.owner.rotate_bytes
        return (limit is not None and self.seq >= 0
                and self.file_bytes + self.pending_bytes + size > limit)

    def _push(self, data: bytes) -> None:
        self.pending.append(data)
        self.pending_bytes += len(data)
        while self.pending_bytes > self.max_pending_bytes and len(self.pending) > 2:
            # Drop the oldest whole line (never the head, which may be half written).
            head = self.pending.popleft()
            dropped = self.pending.popleft()
            self.pending.appendleft(head)
            self.pending_bytes -= len(dropped)
            self._count_lost(1)

    def _lose_next(self) -> None:
        self.dequeued += 1
        self.seq += 1
        self.prev = GENESIS  # the lost line's hash is unknown; verify reports the gap
        self._count_lost(1)

    def _count_lost(self, count: int) -> None:
        self.lines_dropped += count

    # -- writing -----------------------------------------------------------------------------

    def _flush(self) -> bool:
        """Write every pending line; on failure keep the unwritten bytes and report."""
        if not self.pending:
            return True
        if (self.fd is None or self._replaced()) and not self._reopen():
            return False
        assert self.fd is not None
        data = b"".join(self.pending)
        written = 0
        try:
            while written < len(data):
                written += os.write(self.fd, data[written:])
        except OSError as exc:
            self.file_bytes += written
            self.lines_written += data.count(b"\n", 0, written)
            self.pending.clear()
            self.pending.append(data[written:])
            self.pending_bytes = len(data) - written
            self._failed(f"cannot write audit log {self.path}: {exc}")
            return False
        self.file_bytes += written
        self.lines_written += data.count(b"\n")
        self.pending.clear()
        self.pending_bytes = 0
        self._succeeded()
        return True

    def _reopen(self) -> bool:
        if self.fd is not None:
            self._failed(f"audit log {self.path} was removed or replaced; reopening it")
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None
        try:
            self._open()
        except OSError as exc:
            self._failed(f"cannot reopen audit log {self.path}: {exc}")
            return False
        return True

    def _failed(self, message: str) -> None:
        self.write_errors += 1
        now = time.monotonic()
        if self.writable or now - self._last_error_log >= ERROR_LOG_INTERVAL:
            mode = ("refusing new connections (--audit-fail closed)"
                    if self.owner.fail_mode == "closed"
                    else "still serving (--audit-fail open)")
            logger.error("%s [%d write errors, %d lines waiting; %s]", message,
                         self.write_errors, sum(c.count(b"\n") for c in self.pending), mode)
            self._last_error_log = now
        self.writable = False

    def _succeeded(self) -> None:
        if not self.writable:
            logger.warning("audit log %s is writable again after %d write errors",
                           self.path, self.write_errors)
            self.writable = True
        if self._report_loss():
            self._flush()

    def _report_loss(self) -> bool:
        if self.lines_dropped <= self.loss_reported:
            return False
        self.loss_reported = self.lines_dropped
        self._control({"type": "loss", "run": self.run_id, "lost": self.lines_dropped})
        logger.error("audit log %s: %d lines lost so far", self.path, self.lines_dropped)
        return True

    def _rotate(self) -> None:
        """PATH -> PATH.1.gz (older ones shift up); the chain continues in a new PATH."""
        if not self._flush() or self.path in (None, "-"):
            return
        assert self.path is not None
        assert self.fd is not None
        try:
            os.close(self.fd)
            self.fd = None
            _shift_rotated(self.path)
            os.rename(self.path, f"{self.path}.1")
            self._open()
        except OSError as exc:
            self._failed(f"cannot rotate audit log {self.path}: {exc}")
            if self.fd is None:
                self._reopen()
            return
        self.rotations += 1
        self._control({"type": "rotate", "run": self.run_id, "part": self.rotations})
        try:
            _gzip_file(f"{self.path}.1")
        except OSError as exc:  # the uncompressed PATH.1 stays; readers accept both
            logger.error("cannot compress rotated audit log %s.1: %s", self.path, exc)

    def _finish(self) -> None:
        self._report_loss()
        if self._needs_rotation(400):  # rotate first, so that "lines" counts the rotate record
            self._rotate()
        self._control({"type": "end", "run": self.run_id, "lines": self.seq + 1,
                       "requests": self.requests, "write_errors": self.write_errors,
                       "dropped": self.lines_dropped})
        deadline = time.monotonic() + self.close_timeout
        while not self._flush() and time.monotonic() < deadline:
            time.sleep(self.retry_interval)
        if self.pending:
            lost = sum(chunk.count(b"\n") for chunk in self.pending)
            self.lines_abandoned += lost
            logger.error("audit log %s: %d lines could not be written before close",
                         self.path, lost)
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None


def rotated_name(path: str, index: int) -> str:
    return f"{path}.{index}.gz"


def _shift_rotated(path: str) -> None:
    top = 1
    while os.path.exists(rotated_name(path, top)) or os.path.exists(f"{path}.{top}"):
        top += 1
    for index in range(top - 1, 0, -1):
        for suffix in (".gz", ""):
            source = f"{path}.{index}{suffix}"
            if os.path.exists(source):
                os.rename(source, f"{path}.{index + 1}{suffix}")


def _gzip_file(source: str) -> None:
    temporary = f"{source}.gz.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    # Level 1: JSON lines still shrink several times over, at a fraction of level 6's CPU.
    with (open(source, "rb") as reader, open(fd, "wb") as raw,
          gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1) as writer):
        shutil.copyfileobj(reader, writer, 1024 * 1024)
    os.rename(temporary, f"{source}.gz")
    os.unlink(source)

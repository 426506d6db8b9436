"""The audit writer thread: the hash chain, batched writes, rotation, retries.

Strategy: one thread owns the file and the chain. It takes serialized records from a
`queue.SimpleQueue` (filled by `AuditLog.record()` on the event loop; `handover.py` says what
the queue carries), appends `seq` and
`prev` (format.py's chain), joins every line already queued into one `os.write`, and before
each write checks that the path still names the file it holds (a removed or replaced file is
reopened and counted). A failed write keeps the unwritten bytes, reports, and is retried
every `retry_interval`; lines beyond `max_pending_bytes` are given up but keep their `seq`
(`backlog.py`), so the gap is visible to `egress audit verify`, and a `loss` record tells how
many. An outage is marked by `outage` and `recovered` records (`outage.py`).

Counters (`write_errors`, `lines_written`, ...) are written by this thread only and read by
others; under the GIL a reader sees a recent value, which is all a counter promises.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from egress.audit.backlog import Backlog
from egress.audit.disk import LogFile
from egress.audit.format import (
    FORMAT,
    GENESIS,
    Clock,
    chain_line,
    encode_record,
    line_hash,
    record_ts,
    unchain_line,
)
from egress.audit.handover import (
    BATCH_LINES,
    DROPPED,
    STOP,
    abandon_queued,
    lines_in,
    release_waiters,
    take_batch,
)
from egress.audit.outage import Outage

logger = logging.getLogger("egress.audit")

CLOSE_TIMEOUT: Final = 5.0  # aclose() gives an unwritable log this long for the end record
ERROR_LOG_INTERVAL: Final = 10.0  # seconds between repeated "still failing" reports

_SANDBOX: Final = '"method":"SANDBOX"'  # the lifecycle methods (format.LIFECYCLE_METHODS)
_PROBE: Final = '"method":"PROBE"'


class LogWriter:
    """Everything that happens on the writer thread. Counters are read by other threads."""

    # extra start-record fields: `worker`/`workers` under `egress serve --workers`
    start_fields: Mapping[str, object] = MappingProxyType({})

    def __init__(
        self,
        path: str | None,
        *,
        fail_mode: str,
        keep_query: bool,
        rotate_bytes: int | None,
        retry_interval: float,
        max_pending_bytes: int,
        close_timeout: float,
        clock: Clock | None = None,
        keep: int | None = None,
        reserve_bytes: int = 0,
    ) -> None:
        self.path = path
        self.fail_mode = fail_mode
        self.keep_query = keep_query
        self.rotate_bytes = rotate_bytes
        self.retry_interval = retry_interval
        self.run_id = os.urandom(16).hex()
        # one clock for every record (docs/audit-log.md#timestamps): the AuditLog's
        self.clock = clock if clock is not None else Clock()
        self.keep = keep  # rotated files kept (None: all)
        # closed mode: bytes kept allocated past the file's end, for the records of what was
        # admitted before the disk filled (docs/audit-log.md#when-the-log-cannot-be-written)
        self.reserve_bytes = reserve_bytes if path not in (None, "-") else 0
        self.file = LogFile(path)
        self.seq = -1
        self.prev = GENESIS
        self.requests = 0
        self.rotations = 0
        self.pending = Backlog(max_pending_bytes)  # chained lines not yet written
        self.last_body = ""  # the last line taken from the queue: mid-run control records' ts
        self.dequeued = 0
        self.write_errors = 0
        self.lines_written = 0
        self.lines_dropped = 0  # lost in this writer, reported by a loss record
        self.lines_abandoned = 0  # recorded after close, or never written at close
        self.loss_reported = 0  # lines_dropped already told in a loss record
        self.writable = True
        self.crashed = False
        self.cursor = 0  # index in the batch being processed
        self.close_timeout = close_timeout
        self._last_error_log = 0.0
        self.outage = Outage()  # the one in progress, if `outage.since`

    # -- opening ---------------------------------------------------------------------------

    def open_initial(self) -> None:
        """Open the file (raises OSError), link the start record to its last line."""
        if self.path == "-":
            self.file.open_stdout()
            return
        self.file.open()
        tail = self.file.tail()
        if tail:
            complete = tail.endswith(b"\n")
            last = tail.rstrip(b"\n").rsplit(b"\n", 1)[-1]
            self.prev = line_hash(last)
            if not complete:  # a crashed run left half a line: end it, keep it visible
                self._push(b"\n")

    # -- the thread ------------------------------------------------------------------------

    def run(self, source: queue.SimpleQueue[object]) -> None:
        try:
            self._control(
                {
                    "type": "start",
                    "run": self.run_id,
                    "format": FORMAT,
                    "pid": os.getpid(),
                    "fail_mode": self.fail_mode,
                    "keep_query": self.keep_query,
                    "rotate_bytes": self.rotate_bytes,
                    **self.start_fields,
                }
            )
            self._flush()
            stopping = False
            while not stopping:
                stopping = self._run_batch(source)
            if not self.crashed:
                self._finish()
        except Exception:
            self._crash()
        finally:
            self.lines_abandoned += abandon_queued(source)

    def _crash(self) -> None:
        # A bug must not pass for a healthy log: say so loudly, and fail closed.
        self.writable = False
        self.crashed = True
        logger.critical(
            "audit writer thread crashed; the audit log is no longer written", exc_info=True
        )

    def _run_batch(self, source: queue.SimpleQueue[object]) -> bool:
        watch = bool(self.pending) or self.fail_mode == "closed"
        batch = take_batch(source, self.retry_interval if watch else None)
        if batch is None:
            self._idle_check()
            return False
        self.cursor = 0
        try:
            return self._process(batch)
        except Exception:
            # Lines chained before the failure are still written; the rest are counted.
            self.lines_abandoned += lines_in(batch[self.cursor :])
            with contextlib.suppress(Exception):
                self._flush()
            self._crash()
            return True
        finally:  # flush() waiters are released even if processing failed
            release_waiters(batch)

    def _process(self, batch: list[object]) -> bool:
        """Chain the batch's lines and write them; True when it held STOP."""
        stopping = False
        for index, item in enumerate(batch):
            self.cursor = index
            if isinstance(item, str):
                self._line(item)
            elif item is DROPPED:
                self._lose_next()
            elif item is STOP:
                stopping = True
                # raced with aclose(): counted, not written
                self.lines_abandoned += lines_in(batch[index + 1 :])
                break
        self._flush()
        return stopping

    def _idle_check(self) -> None:
        # Retry pending lines; in closed mode also notice a removed file while idle, so
        # the proxy stops accepting before the next connection rather than after it.
        if self.pending:
            self._flush()
        elif (self.file.fd is None or self.file.replaced()) and self._reopen():
            self._succeeded()
        elif not self.writable and self._top_up():  # room for the reserve again
            self._succeeded()

    def _line(self, body: str) -> None:
        self.dequeued += 1
        head = body[:64]  # `ts` comes first (AuditLog.record), `type` right after it
        if ('"type":"' not in head or '"type":"request"' in head) and not (
            _SANDBOX in body or _PROBE in body
        ):
            # policy, open and progress records are not requests, nor are the lifecycle
            # records (docs/audit-log.md#sandbox-records); inside a JSON string a quote is
            # escaped, so these texts can only be the record's own method field
            self.requests += 1
        if not self.writable:
            self.outage.count(body, head)
        self.last_body = body
        self._chain(body)

    def _control(self, fields: dict[str, object], *, now: bool = False) -> None:
        """Chain a control record. Its `ts` is the clock's now for start and end, and
        otherwise that of the line taken from the queue last, so the file's timestamps stay
        in order around it (docs/audit-log.md#timestamps)."""
        ts = (None if now else record_ts(self.last_body)) or self.clock.now()
        record: dict[str, object] = {"type": fields.pop("type"), "ts": ts}
        record.update(fields)
        # rotate, reopen, outage and recovered records come from inside a write or a rotation
        self._chain(encode_record(record), may_rotate=record["type"] in ("start", "loss", "end"))

    def _chain(self, body: str, *, may_rotate: bool = True) -> None:
        line = chain_line(body, self.seq + 1, self.prev)
        if may_rotate and self._needs_rotation(len(line) + 1):
            self._rotate(len(line) + 1)
            line = chain_line(body, self.seq + 1, self.prev)
        self.seq += 1
        self.prev = line_hash(line)
        self._push(line + b"\n")

    def _needs_rotation(self, size: int) -> bool:
        limit = self.rotate_bytes
        return (
            limit is not None
            and self.seq >= 0
            and self.file.size + self.pending.size + size > limit
        )

    def _push(self, data: bytes) -> None:
        self.lines_dropped += self.pending.push(data)

    def _lose_next(self) -> None:
        self.dequeued += 1
        self.seq += 1
        self.prev = GENESIS  # the lost line's hash is unknown; verify reports the gap
        self.lines_dropped += 1

    # -- writing -----------------------------------------------------------------------------

    def _flush(self) -> bool:
        """Write every pending line; on failure keep the unwritten bytes and report."""
        if not self.pending:
            return True
        if (self.file.fd is None or self.file.replaced()) and not self._reopen():
            return False
        data, skip = self.pending.take()
        written, exc = self.file.write(memoryview(data)[skip:] if skip else data)
        if exc is not None:
            # whole lines are kept, so a file reopened now gets them whole (`_relink`)
            self.lines_written += self.pending.keep(data, skip, skip + written)
            self._failed(f"cannot write audit log {self.path}: {exc}")
            return False
        self.lines_written += data.count(b"\n", skip)
        if self._top_up():
            self._succeeded()
        return True

    def _top_up(self) -> bool:
        """Closed mode: allocate `reserve_bytes` past the end again (only what the last
        writes used). False when the disk has no room for it: the log is then not
        writable for the proxy (it admits nothing new), while what it admitted is written
        into the reserve (docs/audit-log.md#when-the-log-cannot-be-written)."""
        if not self.reserve_bytes or self.file.fd is None:
            return True
        try:
            if not self.file.reserve(self.reserve_bytes):
                logger.warning(
                    "audit log %s: the file system cannot reserve space (no fallocate); "
                    "closed mode then learns of a full disk only by a failed write",
                    self.path,
                )
                self.reserve_bytes = 0
            return True
        except OSError as exc:
            if self.writable:  # the outage begins here; retried when idle
                self._failed(
                    f"cannot keep {self.reserve_bytes} bytes reserved for audit log "
                    f"{self.path}: {exc}"
                )
            return False

    def _reopen(self) -> bool:
        if self.file.fd is not None:
            self._failed(f"audit log {self.path} was removed or replaced; reopening it")
            self.file.close()
        try:
            self.file.open()
        except OSError as exc:
            self._failed(f"cannot reopen audit log {self.path}: {exc}")
            return False
        if self.seq >= 0:
            self._relink()
        return True

    def _relink(self) -> None:
        """A file opened mid-run begins with a `reopen` record whose `seq` - 1 and `prev`
        name the last line the previous file got, so it verifies alone and after it; the
        lines that file did not get follow, chained anew (a gap stays a gap)."""
        data, _ = self.pending.take()
        lines = [unchain_line(line) for line in data.split(b"\n") if line]
        parsed = [line for line in lines if line is not None]
        if parsed:  # rewind to the last line written
            _, first_seq, first_prev = parsed[0]
            self.seq, self.prev = first_seq - 1, first_prev
        self._control({"type": "reopen", "run": self.run_id})
        last = self.seq - 1
        for body, seq, _ in parsed:
            if seq > last + 1:  # lines lost in between keep their places
                self.seq += seq - last - 1
                self.prev = GENESIS
            last = seq
            self._chain(body, may_rotate=False)

    def _failed(self, message: str) -> None:
        self.write_errors += 1
        now = time.monotonic()
        if self.writable and self.seq >= 0:  # an outage begins: mark its place in the chain
            self.outage.begin(now, self.write_errors - 1, self.lines_dropped)
            self._control(
                {"type": "outage", "run": self.run_id, "error": message, "mode": self.fail_mode}
            )
        if self.writable or now - self._last_error_log >= ERROR_LOG_INTERVAL:
            mode = (
                "refusing new connections (--audit-fail closed)"
                if self.fail_mode == "closed"
                else "still serving (--audit-fail open)"
            )
            logger.error(
                "%s [%d write errors, %d lines waiting; %s]",
                message,
                self.write_errors,
                self.pending.lines(),
                mode,
            )
            self._last_error_log = now
        self.writable = False

    def _succeeded(self) -> None:
        recovered = False
        if not self.writable:
            logger.warning(
                "audit log %s is writable again after %d write errors", self.path, self.write_errors
            )
            self.writable = True
            if self.outage.since:
                recovered = True
                counts = self.outage.recovered(
                    time.monotonic(), self.write_errors, self.lines_dropped
                )
                self._control({"type": "recovered", "run": self.run_id, **counts})
        if self._report_loss() or recovered:
            self._flush()

    def _report_loss(self) -> bool:
        if self.lines_dropped <= self.loss_reported:
            return False
        self.loss_reported = self.lines_dropped
        self._control({"type": "loss", "run": self.run_id, "lost": self.lines_dropped})
        logger.error("audit log %s: %d lines lost so far", self.path, self.lines_dropped)
        return True

    def _rotate(self, size: int) -> None:
        """PATH -> PATH.1.gz (older ones shift up); the chain continues in a new PATH."""
        if not self._flush() or self.path in (None, "-"):
            return
        if self.file.replaced():  # moved or removed under us: the new file is the rotation
            if self._reopen():
                self._flush()
            return
        if not self._needs_rotation(size):
            return  # the flush found the file replaced and began a new one: no need
        try:
            self.file.rotate()
        except OSError as exc:
            self._failed(f"cannot rotate audit log {self.path}: {exc}")
            if self.file.fd is None:
                self._reopen()
            return
        self.rotations += 1
        self._control({"type": "rotate", "run": self.run_id, "part": self.rotations})
        try:
            self.file.compress_rotated()
        except Exception as exc:  # the uncompressed PATH.1 stays; readers accept both
            logger.error("cannot compress rotated audit log %s.1: %s", self.path, exc)
        if self.keep is not None:
            try:
                self.file.prune(self.keep)
            except OSError as exc:
                logger.error("cannot remove old rotated audit logs of %s: %s", self.path, exc)

    def _finish(self) -> None:
        self._report_loss()
        if self._needs_rotation(400):  # rotate first, so that "lines" counts the rotate record
            self._rotate(400)
        self._control(
            {
                "type": "end",
                "run": self.run_id,
                "lines": self.seq + 1,
                "requests": self.requests,
                "write_errors": self.write_errors,
                "dropped": self.lines_dropped,
            },
            now=True,
        )
        deadline = time.monotonic() + self.close_timeout
        while not self._flush() and time.monotonic() < deadline:
            time.sleep(self.retry_interval)
        if self.pending:
            lost = self.pending.lines()
            self.lines_abandoned += lost
            logger.error(
                "audit log %s: %d lines could not be written before close", self.path, lost
            )
        self.file.close()


__all__ = [
    "BATCH_LINES",
    "CLOSE_TIMEOUT",
    "DROPPED",
    "ERROR_LOG_INTERVAL",
    "STOP",
    "LogWriter",
    "abandon_queued",
]

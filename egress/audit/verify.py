"""The chain verifier: streaming, pure (docs/audit-log.md#tamper-evidence-the-hash-chain).

Feed lines in order, then `finish`. DoS bounds: memory is bounded by `HASH_WINDOW`
remembered hashes plus one entry per gap found, never by the number of lines.

Pure: lines in, findings out; reading the files is `cli.py`'s.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Final

from egress.audit.format import GENESIS, LIFECYCLE_METHODS, REQUEST_TYPES, line_hash

HASH_WINDOW: Final = 4096  # hashes remembered by seq, to check a reordered line's prev
OPEN_WINDOW: Final = 65536  # open records remembered per run while waiting for their end
CONTINUES: Final = frozenset({"rotate", "reopen"})  # may begin a file: the chain goes on


@dataclass
class Problem:
    where: str  # "file:line"
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


@dataclass
class _Run:
    run_id: str
    where: str
    last_seq: int = 0
    ended: bool = False
    requests: int = 0
    whole: bool = True  # begins with its start record: its end record's counts can be checked
    hashes: OrderedDict[int, tuple[str, str]] = field(default_factory=OrderedDict)
    missing: list[tuple[int, int, str]] = field(default_factory=list)  # lo, hi, where
    # open records without their end record yet: id -> (where, what)
    opened: OrderedDict[object, tuple[str, str]] = field(default_factory=OrderedDict)
    opened_overflow: int = 0  # open records beyond OPEN_WINDOW (counted, not listed)


@dataclass
class OpenAtCrash:
    """A tunnel or request whose open record has no end record in a run that crashed."""

    where: str  # "file:line" of its open record
    run_id: str
    link: object  # its `id`
    what: str  # "CONNECT host:port from client"

    def __str__(self) -> str:
        return f"{self.where}: open at crash: id {self.link} {self.what} (run {self.run_id})"


@dataclass
class VerifyResult:
    problems: list[Problem]
    lines: int
    runs: int
    requests: int
    head: str | None  # SHA-256 of the last line: compare with a value kept out of band
    # (worker, workers, where) of each start record written under `serve --workers`
    workers: list[tuple[int, int, str]] = field(default_factory=list)
    open_at_crash: list[OpenAtCrash] = field(default_factory=list)
    open_at_crash_unlisted: int = 0  # beyond OPEN_WINDOW per run
    continued: list[str] = field(default_factory=list)  # chains that begin mid-run: notes


class ChainVerifier:
    """Feed lines in order with `feed`, then call `finish`. Pure and streaming.

    `live=True` accepts a final run without an end record (a log still being written).
    """

    def __init__(self, *, live: bool = False) -> None:
        self.live = live
        self.problems: list[Problem] = []
        self._run: _Run | None = None
        self._prev_line: bytes | None = None
        self._prev_bad = False
        self._lines = 0
        self._runs = 0
        self._requests = 0
        self._workers: list[tuple[int, int, str]] = []
        self.open_at_crash: list[OpenAtCrash] = []
        self._open_unlisted = 0
        self.continued: list[str] = []

    def feed(self, where: str, line: bytes, *, complete: bool = True) -> None:
        """One line without its newline; `complete=False` if the file ended without one."""
        self._lines += 1
        record = self._parse(where, line, complete)
        if record is None:
            self._note_bad_line(where, line)
            return
        kind = record.get("type")
        if kind == "start":
            self._start(where, line, record)
        else:
            self._link(where, line, record)
        self._prev_line = line
        self._prev_bad = False

    def _parse(self, where: str, line: bytes, complete: bool) -> dict[str, object] | None:
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not complete:
            self._fail(where, "truncated line (the file ends in the middle of a line)")
            return None
        if not isinstance(record, dict):
            self._fail(where, "edited or corrupted: not a JSON object")
            return None
        seq, prev = record.get("seq"), record.get("prev")
        if type(seq) is not int or not isinstance(prev, str) or len(prev) != 64:
            self._fail(where, "edited or corrupted: no valid seq/prev fields")
            return None
        return record

    def _note_bad_line(self, where: str, line: bytes) -> None:
        # The bad line still took a place in the chain; do not blame its successor too.
        if self._run is not None:
            self._run.whole = False  # it may have been a request record: counts differ
            self._run.last_seq += 1
            self._remember(self._run.last_seq, line_hash(line), where)
        self._prev_line = line
        self._prev_bad = True

    def _start(self, where: str, line: bytes, record: dict[str, object]) -> None:
        self._end_run(where)
        self._runs += 1
        index, count = record.get("worker"), record.get("workers")
        if type(index) is int and type(count) is int:
            self._workers.append((index, count, where))
        if record["seq"] != 0:
            self._fail(where, f"start record with seq {record['seq']} (expected 0)")
        prev = record["prev"]
        if self._prev_line is not None:
            if prev != line_hash(self._prev_line) and not self._prev_bad:
                self._fail(
                    where,
                    "run start does not link to the line before it "
                    "(lines deleted or edited before this run)",
                )
        elif prev != GENESIS:
            self._fail(
                where,
                "run start links to earlier lines that were not given "
                "(deleted, or older files not passed)",
            )
        self._run = _Run(run_id=str(record.get("run", "?")), where=where)
        self._remember(0, line_hash(line), where)

    def _link(self, where: str, line: bytes, record: dict[str, object]) -> None:
        run = self._run
        seq = record["seq"]
        assert isinstance(seq, int)
        if run is None:
            kind = record.get("type")
            run_id = str(record.get("run", "?"))
            if kind == "rotate" and self._prev_line is None:
                # the oldest files not given: removed by --audit-keep, or left out. What they
                # held (refusals too) cannot be checked, so this is no OK
                # (docs/audit-log.md#rotation-and-several-runs)
                self._fail(
                    where,
                    f"chain continues run {run_id} after seq {seq - 1} (hash "
                    f"{record['prev']}) in a file not given: seq 0..{seq - 1} of the run were "
                    "removed by --audit-keep or not given, and cannot be checked",
                )
                self._runs += 1
            elif kind in CONTINUES and self._prev_line is None:
                # a reopened file given without the file moved away under the writer (kept
                # elsewhere): it links to it by seq and prev
                self.continued.append(
                    f"{where}: chain continues run {run_id} after seq {seq - 1} "
                    f"(hash {record['prev']}) in a file not given"
                )
                self._runs += 1
            else:
                self._fail(
                    where,
                    "chain does not begin with a start record (earlier lines or files missing?)",
                )
            run = self._run = _Run(run_id=run_id, where=where, last_seq=seq, whole=False)
            self._remember(seq, line_hash(line), where)
            return
        if run.ended:
            self._fail(where, "line after the run's end record")
        expected = run.last_seq + 1
        if seq == expected:
            self._check_prev(where, record, seq)
            run.last_seq = seq
        elif seq > expected:
            run.missing.append((expected, seq - 1, where))
            self._check_prev(where, record, seq)
            run.last_seq = seq
        elif self._fill_gap(seq):
            self._fail(where, f"reordered: seq {seq} comes after seq {run.last_seq}")
            self._check_prev(where, record, seq)
        else:
            self._fail(where, f"duplicated or replayed line: seq {seq} already seen")
        self._remember(seq, line_hash(line), where)
        self._account(where, record)

    def _check_prev(self, where: str, record: dict[str, object], seq: int) -> None:
        assert self._run is not None
        known = self._run.hashes.get(seq - 1)
        if known is None or self._prev_bad:
            return
        digest, known_where = known
        if record["prev"] != digest:
            self._fail(
                known_where,
                f"edited: this line's hash does not match the prev "
                f"recorded at {where} (or that line's prev was edited)",
            )

    def _fill_gap(self, seq: int) -> bool:
        assert self._run is not None
        missing = self._run.missing
        for index, (lo, hi, where) in enumerate(missing):
            if lo <= seq <= hi:
                pieces = [(lo, seq - 1, where), (seq + 1, hi, where)]
                missing[index : index + 1] = [p for p in pieces if p[0] <= p[1]]
                return True
        return False

    def _account(self, where: str, record: dict[str, object]) -> None:
        assert self._run is not None
        kind = record.get("type")
        if kind in REQUEST_TYPES and record.get("method") not in LIFECYCLE_METHODS:
            self._run.requests += 1  # a lifecycle record is no request (docs/audit-log.md)
            self._requests += 1
            link = record.get("id")
            if link is not None and not isinstance(link, dict | list):
                self._run.opened.pop(link, None)
        elif kind == "open":
            self._open(where, record)
        elif kind == "end":
            self._run.ended = True
            if record.get("lines") != record["seq"]:
                self._fail(
                    where,
                    f"end record says lines={record.get('lines')} but has seq {record['seq']}",
                )
            requests = record.get("requests")
            whole = self._run.whole and not self._run.missing
            if whole and requests is not None and requests != self._run.requests:
                self._fail(
                    where,
                    f"end record says requests={requests} but the run has "
                    f"{self._run.requests} request records (request records deleted or added?)",
                )

    def _open(self, where: str, record: dict[str, object]) -> None:
        assert self._run is not None
        link = record.get("id")
        if link is None or isinstance(link, dict | list):
            self._fail(where, "open record without a valid id")
            return
        opened = self._run.opened
        if len(opened) >= OPEN_WINDOW:
            opened.popitem(last=False)
            self._run.opened_overflow += 1
        what = (
            f"{record.get('method', '?')} {record.get('host', '?')}:{record.get('port', '?')} "
            f"from {record.get('client', '?')}"
        )
        opened[link] = (where, what)

    def _remember(self, seq: int, digest: str, where: str) -> None:
        if self._run is None:
            return
        hashes = self._run.hashes
        hashes[seq] = (digest, where)
        if len(hashes) > HASH_WINDOW:
            hashes.popitem(last=False)

    def _end_run(self, where: str, at_eof: bool = False) -> None:
        run = self._run
        if run is None:
            return
        for lo, hi, gap_where in run.missing:
            count = hi - lo + 1
            self._fail(
                gap_where,
                f"{count} line(s) missing just before this one "
                f"(seq {lo}..{hi}: deleted, lost, or a rotated file not given)",
            )
        if run.ended and run.opened:
            first = next(iter(run.opened.values()))[0]
            self._fail(
                first,
                f"{len(run.opened) + run.opened_overflow} open record(s) of a cleanly ended "
                "run have no end record (end records deleted?)",
            )
        elif not run.ended and not (at_eof and self.live):
            for link, (open_where, what) in run.opened.items():
                self.open_at_crash.append(OpenAtCrash(open_where, run.run_id, link, what))
            self._open_unlisted += run.opened_overflow
        if not run.ended and not (at_eof and self.live):
            self._fail(
                where if not at_eof else "end of input",
                f"run {run.run_id} (started at {run.where}) has no end record: "
                "lines deleted at its end, or the proxy did not stop cleanly",
            )
        self._run = None

    def finish(self) -> VerifyResult:
        self._end_run("end of input", at_eof=True)
        head = line_hash(self._prev_line) if self._prev_line is not None else None
        if self._lines == 0:
            self._fail("input", "no lines")
        return VerifyResult(
            self.problems,
            self._lines,
            self._runs,
            self._requests,
            head,
            self._workers,
            self.open_at_crash,
            self._open_unlisted,
            self.continued,
        )

    def _fail(self, where: str, message: str) -> None:
        self.problems.append(Problem(where, message))


_WORKER_FILE = re.compile(r"\.w(\d+)(?:\.[^./]*)?(?:\.\d+(?:\.gz)?)?$")


def worker_problems(
    chains: list[list[str]], results: list[VerifyResult], *, complete: bool = True
) -> list[Problem]:
    """Whole workers missing or renamed (docs/audit-log.md#several-workers): each chain
    verifies on its own, so deleting `audit.w1.jsonl` or renaming it to `audit.w0.jsonl`
    left every remaining chain intact. The start records name their worker and the worker
    count: a start record must sit in its own worker's file, and (when `complete`, i.e. all
    workers' files were meant to be given) every worker of a count must have a file."""
    problems: list[Problem] = []
    seen: dict[int, set[int]] = {}
    for paths, result in zip(chains, results, strict=True):
        named = _WORKER_FILE.search(paths[0]) if paths else None
        for index, count, where in result.workers:
            seen.setdefault(count, set()).add(index)
            if named is not None and int(named.group(1)) != index:
                problems.append(
                    Problem(
                        where,
                        f"start record of worker {index} of {count} in the file of worker "
                        f"{named.group(1)} (a worker's file renamed)",
                    )
                )
    if complete:
        for count, indexes in sorted(seen.items()):
            for index in sorted(set(range(count)) - indexes):
                problems.append(
                    Problem(
                        "input",
                        f"no file of worker {index}: its start records say {count} workers "
                        "wrote chains (a worker's file missing or renamed)",
                    )
                )
    return problems

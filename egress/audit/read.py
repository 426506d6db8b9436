"""Reading audit logs for the reviewer tools: files, filters, summaries.

Strategy: everything streams. Files are opened plain or gzip by their magic bytes, read line
by line in binary (verify needs the exact bytes), and never held whole; a `Summary` keeps
one small entry per distinct host, client, reason and rule (client ports are dropped, or every
connection would be its own client), so memory is bounded by distinct values, never by lines.
Registrable domains are derived from the host table at the end, one tldextract call per
distinct host, with its bundled suffix list (never fetched). Following a growing log is
`follow.py`.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import IO, Final

from egress.audit.format import LIFECYCLE_METHODS, REQUEST_TYPES, rotation_of
from egress.audit.timebounds import normalize_ts

MAX_LINE: Final = 1024 * 1024  # a longer line is not the writer's: kept as a 1 MiB prefix
GZIP_MAGIC: Final = b"\x1f\x8b"


class InputError(Exception):
    """Bad input that ends the command with exit 2 and a one-line message."""


# ---- reading ------------------------------------------------------------------------------

_WORKER_BASE = re.compile(r"\.w(?P<worker>\d+)(?:\.[^./]*)?$")


def worker_files(path: str) -> list[str]:
    """`audit.jsonl`, when only the files of `serve --workers` exist (`audit.w0.jsonl`,
    `audit.w1.jsonl`, their rotations), stands for all of them, by worker number.
    """
    if os.path.exists(path):
        return [path]
    folder, name = os.path.split(path)
    stem, ext = os.path.splitext(name)
    pattern = re.compile(re.escape(stem) + r"\.w(\d+)" + re.escape(ext) + r"(?:\.\d+(?:\.gz)?)?$")
    try:
        names = os.listdir(folder or ".")
    except OSError:
        return [path]
    found = [(int(m.group(1)), n) for n in names if (m := pattern.match(n))]
    return [os.path.join(folder, n) for _, n in sorted(found)] or [path]


def chains(paths: list[str]) -> list[list[str]]:
    """Split ordered paths into independent hash chains: each worker's files of
    `serve --workers` (`P.wI.ext` and its rotations) are one chain; all other files together
    are one chain, as given (docs/audit-log.md#several-workers).
    """
    groups: dict[str, list[str]] = {}
    for path in paths:
        base = (rotation_of(path) or (path, 0))[0]
        key = base if _WORKER_BASE.search(base) else ""
        groups.setdefault(key, []).append(path)
    return list(groups.values())


def order_paths(paths: Iterable[str]) -> list[str]:
    """Put each rotation family (`P.N.gz` ... `P.1.gz`, `P`) oldest first; others as given.

    A path that does not exist but has `serve --workers` files stands for them.
    """
    paths = list(dict.fromkeys(p for given in paths for p in worker_files(given)))
    families: dict[str, list[tuple[int, str]]] = {}
    order: list[str] = []
    for path in paths:
        base, index = rotation_of(path) or (path, 0)
        if base not in families:
            families[base] = []
            order.append(base)
        families[base].append((index, path))
    return [path for base in order for _, path in sorted(families[base], reverse=True)]


def open_log(path: str) -> IO[bytes]:
    """Open a log file, plain or gzip, for binary reading; raises InputError."""
    try:
        raw = open(path, "rb")
        compressed = raw.peek(2)[:2] == GZIP_MAGIC
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not compressed:
        return raw
    unzipped = gzip.GzipFile(fileobj=raw, mode="rb")
    unzipped.myfileobj = raw  # type: ignore[assignment]  # closed with it, like gzip.open
    return unzipped  # type: ignore[return-value]


@dataclass
class Line:
    path: str
    number: int
    data: bytes  # without the newline
    complete: bool  # False for a last line without a newline

    @property
    def where(self) -> str:
        return f"{self.path}:{self.number}"


def read_lines(paths: Iterable[str], damaged: Callable[[str, str], None]) -> Iterator[Line]:
    """Every line of every file in order; `damaged(path, why)` hears of a corrupt gzip."""
    for path in paths:
        with open_log(path) as stream:
            number = 0
            try:
                while raw := stream.readline(MAX_LINE):
                    number += 1
                    complete = raw.endswith(b"\n")
                    if not complete and len(raw) == MAX_LINE:  # not one of ours: skip the rest
                        while (more := stream.readline(MAX_LINE)) and not more.endswith(b"\n"):
                            pass
                        complete = bool(more)
                    yield Line(path, number, raw[:-1] if raw.endswith(b"\n") else raw, complete)
            except (EOFError, OSError, zlib.error) as exc:
                damaged(
                    path, f"compressed data is damaged or ends early after line {number} ({exc})"
                )


def parse_record(data: bytes) -> dict[str, object] | None:
    try:
        record = json.loads(data)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def is_request(record: dict[str, object]) -> bool:
    """A request or tunnel the proxy judged: not a control record, not a lifecycle record."""
    return record.get("type") in REQUEST_TYPES and record.get("method") not in LIFECYCLE_METHODS


def is_lifecycle(record: dict[str, object]) -> bool:
    """A sandbox bound, replaced or released, or the cut's probe of a listener: shaped like a
    request record but no request, so counted apart (docs/audit-log.md#sandbox-records)."""
    return record.get("type") in REQUEST_TYPES and record.get("method") in LIFECYCLE_METHODS


# ---- filtering ---------------------------------------------------------------------------


def client_ip(client: object) -> str:
    """`10.0.0.2:5555` -> `10.0.0.2`; `[2001:db8::1]:5555` -> `2001:db8::1`."""
    text = str(client)
    if text.startswith("["):
        return text[1 : text.find("]")] if "]" in text else text
    return text.rsplit(":", 1)[0] if text.count(":") == 1 else text


def host_matches(pattern: str, host: str) -> bool:
    """fnmatch, case-insensitive; a leading `*.` also matches the apex, as in rules."""
    pattern, host = pattern.lower(), host.lower()
    return fnmatchcase(host, pattern) or (pattern.startswith("*.") and host == pattern[2:])


def mode_of(record: dict[str, object]) -> str:
    """How the client reached the proxy: the record's `mode`, else `forward` for a
    framework-route forwarder, else `http` (the HTTP proxy, which writes no `mode`)."""
    mode = record.get("mode")
    if mode:
        return str(mode)
    return "forward" if record.get("method") == "FORWARD" else "http"


@dataclass
class EventFilter:
    decisions: set[str] = field(default_factory=set)
    hosts: list[str] = field(default_factory=list)
    clients: list[str] = field(default_factory=list)
    reasons: set[str] = field(default_factory=set)
    since: str | None = None  # canonical ts, inclusive
    until: str | None = None  # canonical ts, exclusive
    modes: set[str] = field(default_factory=set)  # `mode`; "http" = none (the HTTP proxy)

    def matches_lifecycle(self, record: dict[str, object]) -> bool:
        """A lifecycle record has no decision to select by: `--decision` never picks one;
        `--reason` does only by its lifecycle reason; host and client select as usual."""
        if self.decisions or self.modes:
            return False
        return self.matches(record)

    def matches(self, record: dict[str, object]) -> bool:
        if self.decisions and record.get("decision") not in self.decisions:
            return False
        if self.reasons and record.get("reason") not in self.reasons:
            return False
        if self.modes and mode_of(record) not in self.modes:
            return False
        if self.hosts and not any(host_matches(p, str(record.get("host", ""))) for p in self.hosts):
            return False
        if self.clients and not self._client_matches(record):
            return False
        return self.in_window(record)

    def in_window(self, record: dict[str, object]) -> bool:
        if self.since is None and self.until is None:
            return True
        ts = normalize_ts(record.get("ts"))
        if ts is None:
            return False
        return (self.since is None or ts >= self.since) and (self.until is None or ts < self.until)

    def _client_matches(self, record: dict[str, object]) -> bool:
        client = str(record.get("client", ""))
        names = (client, client_ip(client), str(record.get("client_id", "")))
        return any(fnmatchcase(name, p) for p in self.clients for name in names)


# ---- summarizing -------------------------------------------------------------------------

_SLOTS: Final = {"allow": 0, "block": 1, "error": 2}
DIMENSIONS: Final = ("host", "domain", "client", "reason", "rule")


def make_domain_of() -> Callable[[str], str]:
    """Registrable domain with tldextract's bundled suffix list; never fetches it."""
    import tldextract

    extract = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)

    def domain_of(host: str) -> str:
        if not host or ":" in host or host.replace(".", "").isdigit():
            return host  # an IP literal is its own domain
        result = extract(host)
        return str(result.top_domain_under_public_suffix or host)

    return domain_of


OPEN_WINDOW: Final = 65536  # open records awaiting their end, per summary (oldest dropped)


class Summary:
    """Counts by decision per host, client, reason and rule; domains derived from hosts.
    Also pairs `open` records with their request records by `id` within a run: those left
    without one when the run ends without an end record are `open_at_crash`."""

    def __init__(self) -> None:
        self.tables: dict[str, dict[str, list[int]]] = {d: {} for d in DIMENSIONS}
        self.totals = [0, 0, 0, 0]  # allow, block, error, other
        self.first_ts: str | None = None
        self.last_ts: str | None = None
        self.runs = 0
        self.bad_lines = 0
        self._opened: dict[object, dict[str, object]] = {}  # id -> open record, this run
        self.open_at_crash: list[dict[str, object]] = []  # the first OPEN_WINDOW of them
        self.open_at_crash_count = 0
        # lifecycle records, apart: (event, sandbox) -> count; bounded by sandboxes
        self.lifecycle: dict[tuple[str, str], int] = {}

    def track(self, record: dict[str, object]) -> None:
        """A record that is not a request: pairs opens with ends (docs/audit-log.md)."""
        kind = record.get("type")
        if kind == "open":
            link = record.get("id")
            if isinstance(link, int | str):
                if len(self._opened) >= OPEN_WINDOW:
                    self._opened.pop(next(iter(self._opened)))
                self._opened[link] = record
        elif kind == "start":
            self.runs += 1
            self.crashed()
        elif kind == "end":
            self._opened.clear()

    def ended(self, record: dict[str, object]) -> None:
        link = record.get("id")
        if self._opened and isinstance(link, int | str):
            self._opened.pop(link, None)

    def crashed(self) -> None:
        """The run ended without an end record (a new start, or the end of the input)."""
        for record in self._opened.values():
            self.open_at_crash_count += 1
            if len(self.open_at_crash) < OPEN_WINDOW:
                self.open_at_crash.append(
                    {k: record.get(k) for k in ("ts", "id", "client", "client_id", "host", "port")}
                )
        self._opened.clear()

    def add_lifecycle(self, record: dict[str, object]) -> None:
        key = (str(record.get("reason") or "(none)"), str(record.get("host") or "(none)"))
        self.lifecycle[key] = self.lifecycle.get(key, 0) + 1

    def add(self, record: dict[str, object]) -> None:
        decision = record.get("decision")
        slot = _SLOTS.get(decision, 3) if isinstance(decision, str) else 3
        self.totals[slot] += 1
        rule = record.get("rule")
        keys = (
            ("host", record.get("host") or "(none)"),
            ("client", record.get("client_id") or client_ip(record.get("client", "(none)"))),
            ("reason", record.get("reason") or "(none)"),
            ("rule", "(none)" if rule is None else rule),
        )
        for name, key in keys:
            table = self.tables[name]
            text = key if isinstance(key, str) else str(key)
            counts = table.get(text)
            if counts is None:
                counts = table[text] = [0, 0, 0, 0]
            counts[slot] += 1
        ts = record.get("ts")
        if isinstance(ts, str):
            if self.first_ts is None or ts < self.first_ts:
                self.first_ts = ts
            if self.last_ts is None or ts > self.last_ts:
                self.last_ts = ts

    def derive_domains(self, domain_of: Callable[[str], str]) -> None:
        domains: dict[str, list[int]] = {}
        for host, counts in self.tables["host"].items():
            total = domains.setdefault(domain_of(host), [0, 0, 0, 0])
            for slot, count in enumerate(counts):
                total[slot] += count
        self.tables["domain"] = domains

    def rows(self, dimension: str, top: int | None) -> tuple[list[dict[str, object]], int]:
        """Rows sorted by blocks, then total; with the number of rows left out."""
        items = sorted(
            self.tables[dimension].items(), key=lambda kv: (-kv[1][1], -sum(kv[1]), kv[0])
        )
        shown = items if top is None else items[:top]
        rows = [
            {"key": key, "block": c[1], "allow": c[0], "error": c[2], "total": sum(c)}
            for key, c in shown
        ]
        return rows, len(items) - len(shown)

    def to_json(self, top: int | None) -> dict[str, object]:
        out: dict[str, object] = {
            "first_ts": self.first_ts,
            "last_ts": self.last_ts,
            "totals": {
                "events": sum(self.totals),
                "allow": self.totals[0],
                "block": self.totals[1],
                "error": self.totals[2],
                "other": self.totals[3],
                "lifecycle": sum(self.lifecycle.values()),
            },
            "runs": self.runs,
            "bad_lines": self.bad_lines,
            "open_at_crash": self.open_at_crash_count,
            "open_at_crash_records": self.open_at_crash[: top if top is not None else None],
        }
        for dimension in DIMENSIONS:
            out[f"by_{dimension}"] = self.rows(dimension, top)[0]
        out["lifecycle"] = self.lifecycle_rows()
        return out

    def lifecycle_rows(self) -> list[dict[str, object]]:
        """The lifecycle records by sandbox, then event (docs/audit-log.md#sandbox-records)."""
        return [
            {"sandbox": sandbox, "event": event, "count": count}
            for (event, sandbox), count in sorted(
                self.lifecycle.items(), key=lambda kv: (kv[0][1], kv[0][0])
            )
        ]


# ---- a cheap look at the chain -------------------------------------------------------------


class ChainWatch:
    """What `summarize` and `export` can tell of a broken chain on their way through the
    lines, at almost no cost: within each chain (a worker's files, or all other files) a
    line's `seq` is the previous one's + 1, except at a run's `start` (0), and a chain begins
    with a `start`, `rotate` or `reopen` record. A gap, a reordered or replayed line or a
    missing first file shows; an edited line does not (only `egress audit verify` hashes
    them), so this is a hint to run verify, never a verdict (docs/audit-log.md)."""

    def __init__(self, paths: list[str]) -> None:
        self._chain = {path: index for index, group in enumerate(chains(paths)) for path in group}
        self._last: dict[int, int] = {}  # chain -> seq of its last line
        self.problems = 0
        self.first: str | None = None  # "FILE:LINE: what"

    def see(self, line: Line, record: dict[str, object] | None) -> None:
        """One line in reading order; `record` is None for an unreadable line."""
        chain = self._chain.get(line.path, -1)
        last = self._last.get(chain)
        if record is None:  # it took a place in the chain: do not blame the next line
            if last is not None:
                self._last[chain] = last + 1
            return
        seq, kind = record.get("seq"), record.get("type")
        if type(seq) is not int:
            self._problem(line, "no seq field")
        elif kind == "start":
            if seq != 0:
                self._problem(line, f"a start record with seq {seq}")
        elif last is None:
            if kind not in ("rotate", "reopen"):
                self._problem(line, "the chain does not begin with a start record")
        elif seq != last + 1:
            self._problem(line, f"seq {seq} follows seq {last}")
        if type(seq) is int:
            self._last[chain] = seq

    def _problem(self, line: Line, what: str) -> None:
        self.problems += 1
        if self.first is None:
            self.first = f"{line.where}: {what}"

    def hint(self) -> str | None:
        """One warning line when something was seen, naming the first place."""
        if not self.problems:
            return None
        return (
            f"the log's chain looks broken at {self.problems} place(s), first {self.first}; "
            "lines may be missing or out of order: run `egress audit verify` before trusting "
            "these results"
        )

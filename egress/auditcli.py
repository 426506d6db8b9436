"""`egress audit summarize|tail|filter|verify`: the reviewer's tools for the audit log.

Strategy: every command streams the log line by line (gzip-rotated files are read
transparently, detected by their magic bytes, not their name), so memory is bounded by what
a command keeps: the summary by the number of distinct hosts, clients, reasons and rules
(client ports are dropped, or every connection would be its own client); tail by `-n`;
verify by `auditfmt.HASH_WINDOW`. Files are read in the order given, except that a rotation
family (`PATH.3.gz PATH.2.gz PATH.1.gz PATH`) is put in chronological order, so a shell
glob `audit.jsonl*` just works. Exit codes: 0 ok, 1 verify failed, 2 usage or bad input.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import sys
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import IO, Final

from egress.auditfmt import (
    CONTROL_TYPES,
    REQUEST_TYPES,
    ChainVerifier,
    Problem,
    canonical_ts,
    normalize_ts,
    parse_time_bound,
    utc_now,
)

DEFAULT_TOP: Final = 15  # rows per table in the terminal summary
DEFAULT_TAIL: Final = 10  # like tail(1)
DEFAULT_INTERVAL: Final = 0.25  # seconds between polls of a followed log
MAX_PROBLEMS_SHOWN: Final = 50  # verify prints this many, then a count
READ_CHUNK: Final = 65536
_GZIP_MAGIC: Final = b"\x1f\x8b"
_ROTATED = re.compile(r"^(?P<base>.+)\.(?P<index>\d+)(?:\.gz)?$")


class InputError(Exception):
    """Bad input that ends the command with exit 2 and a one-line message."""


# ---- reading ------------------------------------------------------------------------------

def order_paths(paths: Iterable[str]) -> list[str]:
    """Put each rotation family (`P.N.gz` ... `P.1.gz`, `P`) oldest first; others as given."""
    paths = list(dict.fromkeys(paths))
    families: dict[str, list[tuple[int, str]]] = {}
    order: list[str] = []
    for path in paths:
        match = _ROTATED.match(path)
        base, index = (match["base"], int(match["index"])) if match else (path, 0)
        if base not in families:
            families[base] = []
            order.append(base)
        families[base].append((index, path))
    return [path for base in order for _, path in sorted(families[base], reverse=True)]


def open_log(path: str) -> IO[bytes]:
    """Open a log file, plain or gzip, for binary reading; raises InputError."""
    try:
        raw = open(path, "rb")
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    with raw:
        compressed = raw.peek(2)[:2] == _GZIP_MAGIC
        if not compressed:
            return open(path, "rb")  # a fresh handle: `raw` closes with this block
    return gzip.open(path, "rb")  # type: ignore[return-value]


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
                for raw in stream:
                    number += 1
                    complete = raw.endswith(b"\n")
                    yield Line(path, number, raw[:-1] if complete else raw, complete)
            except (EOFError, OSError, zlib.error) as exc:
                damaged(path, f"compressed data is damaged or ends early after line "
                              f"{number} ({exc})")


def parse_record(data: bytes) -> dict[str, object] | None:
    try:
        record = json.loads(data)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def is_request(record: dict[str, object]) -> bool:
    return record.get("type") in REQUEST_TYPES


# ---- filtering ---------------------------------------------------------------------------

def client_ip(client: object) -> str:
    """`10.0.0.2:5555` -> `10.0.0.2`; `[2001:db8::1]:5555` -> `2001:db8::1`."""
    text = str(client)
    if text.startswith("["):
        return text[1:text.find("]")] if "]" in text else text
    return text.rsplit(":", 1)[0] if text.count(":") == 1 else text


def host_matches(pattern: str, host: str) -> bool:
    """fnmatch, case-insensitive; a leading `*.` also matches the apex, as in rules."""
    pattern, host = pattern.lower(), host.lower()
    return fnmatchcase(host, pattern) or (pattern.startswith("*.") and host == pattern[2:])


@dataclass
class EventFilter:
    decisions: set[str] = field(default_factory=set)
    hosts: list[str] = field(default_factory=list)
    clients: list[str] = field(default_factory=list)
    reasons: set[str] = field(default_factory=set)
    since: str | None = None  # canonical ts, inclusive
    until: str | None = None  # canonical ts, exclusive

    def matches(self, record: dict[str, object]) -> bool:
        if self.decisions and record.get("decision") not in self.decisions:
            return False
        if self.reasons and record.get("reason") not in self.reasons:
            return False
        if self.hosts and not any(host_matches(p, str(record.get("host", "")))
                                  for p in self.hosts):
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
        return ((self.since is None or ts >= self.since)
                and (self.until is None or ts < self.until))

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


class Summary:
    """Counts by decision per host, client, reason and rule; domains derived from hosts."""

    def __init__(self) -> None:
        self.tables: dict[str, dict[str, list[int]]] = {d: {} for d in DIMENSIONS}
        self.totals = [0, 0, 0, 0]  # allow, block, error, other
        self.first_ts: str | None = None
        self.last_ts: str | None = None
        self.runs = 0
        self.bad_lines = 0

    def add(self, record: dict[str, object]) -> None:
        decision = record.get("decision")
        slot = _SLOTS.get(decision, 3) if isinstance(decision, str) else 3
        self.totals[slot] += 1
        rule = record.get("rule")
        keys = (("host", record.get("host") or "(none)"),
                ("client", record.get("client_id") or client_ip(record.get("client", "(none)"))),
                ("reason", record.get("reason") or "(none)"),
                ("rule", "(none)" if rule is None else rule))
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
        items = sorted(self.tables[dimension].items(),
                       key=lambda kv: (-kv[1][1], -sum(kv[1]), kv[0]))
        shown = items if top is None else items[:top]
        rows = [{"key": key, "block": c[1], "allow": c[0], "error": c[2],
                 "total": sum(c)} for key, c in shown]
        return rows, len(items) - len(shown)

    def to_json(self, top: int | None) -> dict[str, object]:
        out: dict[str, object] = {
            "first_ts": self.first_ts, "last_ts": self.last_ts,
            "totals": {"events": sum(self.totals), "allow": self.totals[0],
                       "block": self.totals[1], "error": self.totals[2],
                       "other": self.totals[3]},
            "runs": self.runs, "bad_lines": self.bad_lines,
        }
        for dimension in DIMENSIONS:
            out[f"by_{dimension}"] = self.rows(dimension, top)[0]
        return out


def render_summary(summary: Summary, top: int | None, header: list[str]) -> str:
    allow, block, error, other = summary.totals
    lines = [*header,
             f"events: {sum(summary.totals)}  block: {block}  allow: {allow}  error: {error}"
             + (f"  other: {other}" if other else ""),
             f"from {summary.first_ts or '-'} to {summary.last_ts or '-'}"
             f"  runs: {summary.runs}"
             + (f"  unreadable lines: {summary.bad_lines}" if summary.bad_lines else "")]
    titles = {"host": "host", "domain": "registrable domain", "client": "client",
              "reason": "reason", "rule": "rule"}
    for dimension in DIMENSIONS:
        rows, hidden = summary.rows(dimension, top)
        lines += ["", f"By {titles[dimension]}:"]
        lines += _table(rows, titles[dimension].upper())
        if hidden:
            lines.append(f"  ... and {hidden} more (--top N, or --json for all)")
    return "\n".join(lines)


def _table(rows: list[dict[str, object]], key_title: str) -> list[str]:
    if not rows:
        return ["  (none)"]
    columns = ("block", "allow", "error", "total")
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in columns}
    head = "  " + "  ".join(c.upper().rjust(widths[c]) for c in columns) + "  " + key_title
    body = ["  " + "  ".join(str(r[c]).rjust(widths[c]) for c in columns) + f"  {r['key']}"
            for r in rows]
    return [head, *body]


# ---- one readable line an event ------------------------------------------------------------

def format_event(record: dict[str, object]) -> str:
    """`TS DECISION METHOD TARGET from CLIENT REASON [rule=..] [status=..] ... -- detail`."""
    kind = record.get("type")
    if kind in CONTROL_TYPES:
        extras = " ".join(f"{k}={v}" for k, v in record.items()
                          if k not in ("type", "ts", "prev"))
        return f"{record.get('ts', '-')} --- {kind} {extras}"
    host, port = record.get("host", "-"), record.get("port")
    target = f"{host}:{port}" if port is not None else str(host)
    if record.get("path") is not None:
        target += str(record["path"])
    parts = [str(record.get("ts", "-")), f"{record.get('decision', '-'):<5}",
             str(record.get("method", "-")), target, "from", str(record.get("client", "-"))]
    if record.get("client_id"):
        parts.append(f"({record['client_id']})")
    parts.append(str(record.get("reason", "-")))
    if record.get("rule") is not None:
        parts.append(f"rule={record['rule']}")
    for key in ("addr", "status", "bytes_up", "bytes_down", "duration_ms"):
        if record.get(key) is not None:
            parts.append(f"{key}={record[key]}")
    if record.get("detail"):
        parts.append(f"-- {record['detail']}")
    return " ".join(parts)


# ---- following a live log ----------------------------------------------------------------

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
        data = self._stream.read(READ_CHUNK * 16)
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
        if stream.peek(2)[:2] == _GZIP_MAGIC:
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


# ---- the commands ------------------------------------------------------------------------

def _warn(message: str) -> None:
    print(f"egress audit: warning: {message}", file=sys.stderr)


def _event_filter(args: argparse.Namespace) -> EventFilter:
    now = utc_now()
    try:
        since = canonical_ts(parse_time_bound(args.since, now)) if args.since else None
        until = canonical_ts(parse_time_bound(args.until, now)) if args.until else None
    except ValueError as exc:
        raise InputError(str(exc)) from None
    return EventFilter(set(getattr(args, "decision", None) or ()),
                       list(getattr(args, "host", None) or ()),
                       list(getattr(args, "client", None) or ()),
                       set(getattr(args, "reason", None) or ()), since, until)


def cmd_summarize(args: argparse.Namespace) -> int:
    paths = order_paths(args.paths)
    window = _event_filter(args)
    summary = Summary()
    for line in read_lines(paths, lambda p, why: _warn(f"{p}: {why}")):
        record = parse_record(line.data)
        if record is None:
            summary.bad_lines += 1
        elif record.get("type") == "start":
            summary.runs += 1
        elif is_request(record) and window.in_window(record):
            summary.add(record)
    summary.derive_domains(make_domain_of())
    if summary.bad_lines:
        _warn(f"{summary.bad_lines} line(s) were not JSON objects and were skipped "
              "(run `egress audit verify`)")
    if args.json:
        out = {"files": paths, "since": window.since, "until": window.until,
               **summary.to_json(args.top)}
        print(json.dumps(out, indent=2))
    else:
        header = [f"files: {' '.join(paths)}"]
        if window.since or window.until:
            header.append(f"window: {window.since or '-'} .. {window.until or '-'}")
        print(render_summary(summary, args.top or DEFAULT_TOP, header))
    return 0


def _selected(args: argparse.Namespace, chooser: EventFilter,
              lines: Iterable[bytes]) -> Iterator[tuple[bytes, dict[str, object]]]:
    for data in lines:
        record = parse_record(data)
        if record is None:
            continue
        if is_request(record):
            if chooser.matches(record):
                yield data, record
        elif args.control and chooser.in_window(record):
            yield data, record


def _emit(args: argparse.Namespace, data: bytes, record: dict[str, object]) -> None:
    text = data.decode("utf-8", "replace") if args.json else format_event(record)
    print(text, flush=args.follow if "follow" in args else False)


def cmd_filter(args: argparse.Namespace) -> int:
    chooser = _event_filter(args)
    lines = (line.data for line in read_lines(order_paths(args.paths),
                                              lambda p, why: _warn(f"{p}: {why}")))
    for data, record in _selected(args, chooser, lines):
        _emit(args, data, record)
    return 0


def cmd_tail(args: argparse.Namespace) -> int:
    paths = order_paths(args.paths)
    chooser = _event_filter(args)
    history, live = (paths[:-1], paths[-1]) if args.follow else (paths, None)
    follower = Follower(live) if live is not None else None
    last: deque[tuple[bytes, dict[str, object]]] = deque(maxlen=max(args.lines, 0))
    try:
        last.extend(_selected(args, chooser, (line.data for line in read_lines(
            history, lambda p, why: _warn(f"{p}: {why}")))))
        if follower is not None:
            last.extend(_selected(args, chooser, _drain(follower)))
        for data, record in last:
            _emit(args, data, record)
        while follower is not None:
            for data, record in _selected(args, chooser, _drain(follower)):
                _emit(args, data, record)
            time.sleep(args.interval)
    except KeyboardInterrupt:
        pass
    finally:
        if follower is not None:
            follower.close()
    return 0


def _drain(follower: Follower) -> Iterator[bytes]:
    while True:
        lines = follower.read()
        if not lines:
            return
        yield from lines


def cmd_verify(args: argparse.Namespace) -> int:
    paths = order_paths(args.paths)
    verifier = ChainVerifier(live=args.live)
    for line in read_lines(paths, lambda p, why: verifier.problems.append(
            Problem(p, why))):
        verifier.feed(line.where, line.data, complete=line.complete)
    result = verifier.finish()
    if args.head and result.head != args.head.lower():
        result.problems.append(Problem("end of input", f"head is {result.head}, "
                                        f"expected {args.head} (lines missing or edited)"))
    for problem in result.problems[:MAX_PROBLEMS_SHOWN]:
        print(problem)
    if len(result.problems) > MAX_PROBLEMS_SHOWN:
        print(f"... and {len(result.problems) - MAX_PROBLEMS_SHOWN} more problems")
    for warning in result.warnings:
        print(f"{warning} (warning)")
    verdict = "FAILED" if result.problems else "OK"
    problems = f", {len(result.problems)} problem(s)" if result.problems else ""
    print(f"{verdict}: {result.lines} lines in {len(paths)} file(s), {result.runs} run(s), "
          f"{result.requests} request records{problems}; head {result.head}")
    return 1 if result.problems else 0


# ---- argument parsing --------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="egress audit",
                                     description="Read, filter and verify egress audit logs.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    summarize = commands.add_parser("summarize", help="counts by host, domain, client, "
                                    "reason and rule")
    _add_window(summarize)
    summarize.add_argument("--json", action="store_true", help="JSON for tooling")
    summarize.add_argument("--top", type=int, metavar="N",
                           help=f"rows per table (default {DEFAULT_TOP}; all with --json)")
    summarize.add_argument("paths", nargs="+", metavar="PATH")
    for name, help_text in (("filter", "print the events that match"),
                            ("tail", "print the last events, and follow with -f")):
        sub = commands.add_parser(name, help=help_text)
        _add_window(sub)
        _add_selectors(sub)
        if name == "tail":
            sub.add_argument("-n", "--lines", type=int, default=DEFAULT_TAIL, metavar="N")
            sub.add_argument("-f", "--follow", action="store_true",
                             help="keep reading as the log grows; survives rotation")
            sub.add_argument("--interval", type=float, default=DEFAULT_INTERVAL,
                             metavar="SECONDS", help="poll interval with --follow")
        sub.add_argument("paths", nargs="+", metavar="PATH")
    verify = commands.add_parser("verify", help="check the hash chain: exit 1 if broken")
    verify.add_argument("--live", action="store_true",
                        help="accept a last run without an end record (still being written)")
    verify.add_argument("--head", metavar="SHA256",
                        help="the head hash kept out of band; the chain must end there")
    verify.add_argument("paths", nargs="+", metavar="PATH")
    return parser


def _add_window(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--since", metavar="TIME",
                        help="RFC 3339 (2026-11-30T05:00:00Z) or relative (90s, 15m, 1h, 2d)")
    parser.add_argument("--until", metavar="TIME", help="exclusive; same forms as --since")


def _add_selectors(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--decision", action="append", choices=("allow", "block", "error"))
    parser.add_argument("--host", action="append", metavar="PATTERN",
                        help="fnmatch pattern; *.example.com matches the apex too")
    parser.add_argument("--client", action="append", metavar="PATTERN",
                        help="matches ip:port, ip or client_id (fnmatch)")
    parser.add_argument("--reason", action="append", metavar="CODE")
    parser.add_argument("--control", action="store_true",
                        help="also print start/rotate/loss/end records")
    parser.add_argument("--json", action="store_true", help="print the raw JSON lines")


COMMANDS: Final[dict[str, Callable[[argparse.Namespace], int]]] = {
    "summarize": cmd_summarize, "filter": cmd_filter, "tail": cmd_tail, "verify": cmd_verify,
}


def audit_main(argv: list[str]) -> int:
    """`egress audit ARGV...` (ARGV without the word "audit"); returns the exit code."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # argparse has printed usage and the error
        return exc.code if isinstance(exc.code, int) else 2
    try:
        return COMMANDS[args.command](args)
    except InputError as exc:
        print(f"egress audit: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `| head`: the reader left; not an error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the exit-time flush does not fail again
        os.close(devnull)
        return 0


def main() -> None:  # pragma: no cover - `python -m egress.auditcli`
    sys.exit(audit_main(sys.argv[1:]))


if __name__ == "__main__":  # pragma: no cover
    main()

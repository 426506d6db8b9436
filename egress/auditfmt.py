"""The audit record format: timestamps, redaction, the hash chain and its verifier.

Strategy: pure code, stdlib only (no asyncio, no sockets, no files), shared by the writer
(`audit.py`, on the proxy's hot path) and the reviewer tooling (`auditcli.py`).

The chain, exactly (docs/audit-log.md repeats it for reviewers):

- A line is one JSON object, serialized without spaces, ASCII only, followed by `\\n`.
- Every line carries `seq` (an integer) and `prev` (64 hex digits) as its last two fields.
- A run begins with a start record `{"type": "start", "run": <random 128-bit hex>, "seq": 0,
  ...}` whose `prev` is the SHA-256 of the last line that was already in the file when the
  run opened it, or `"0" * 64` when the file was empty or new.
- Every other line has `seq` = previous line's `seq` + 1 and `prev` = hex SHA-256 of the
  previous line's exact bytes (without its newline). The chain runs on across rotated files.
- A clean run ends with `{"type": "end", "lines": N, "seq": N, ...}`.

DoS bounds of the verifier: memory is bounded by `HASH_WINDOW` remembered hashes plus one
entry per gap found, never by the number of lines.
"""

from __future__ import annotations

import hashlib
import json
import json.encoder
import re
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from json.encoder import encode_basestring_ascii
from typing import Final

GENESIS: Final = "0" * 64
FORMAT: Final = "egress-audit/1"

# Record types. A line without "type" (or with type "request") is one request or tunnel.
REQUEST_TYPES: Final = frozenset({None, "request"})
CONTROL_TYPES: Final = frozenset({"start", "end", "rotate", "loss"})

DECISIONS: Final = ("allow", "block", "error")

# Reason codes the proxy writes, with a one-line meaning (docs/audit-log.md lists them too).
REASONS: Final[dict[str, str]] = {
    "allow_rule": "an allow rule matched (rule names it)",
    "default_allow": "no rule matched and the default posture is allow",
    "framework_route": "the destination is a framework route",
    "block_rule": "a block rule matched (rule names it)",
    "default_deny": "no rule matched and the default posture is deny",
    "port_not_allowed": "the host is allowed but not on this port or scheme",
    "reserved_address": "the destination resolved to a reserved address (detail says which)",
    "sni_mismatch": "the TLS ClientHello named a server the policy does not allow",
    "sni_missing": "no SNI (or not TLS) and the CONNECT host was not an allowed name",
    "dns_error": "the name did not resolve",
    "dns_timeout": "the resolver did not answer in time (or is saturated by names that do not)",
    "connection_refused": "the upstream refused the connection",
    "connection_timeout": "the upstream did not answer within the connect timeout",
    "upstream_error": "the upstream connection failed otherwise",
    "bad_request": "a malformed request (400)",
    "head_too_large": "a request head over the size or header-count limit (431)",
    "auth_required": "no proxy credentials were presented (407)",
    "auth_failed": "proxy credentials were presented but not accepted (407)",
    "too_many_connections": "over the concurrent connection limit (503)",
    "audit_unavailable": "refused because the audit log cannot be written (--audit-fail closed)",
    "idle_timeout": "the connection was closed for inactivity",
    "shutdown": "the connection was closed because the proxy stopped",
    "sandbox_added": "prepare_execution bound a sandbox to the proxy (method SANDBOX)",
    "sandbox_replaced": "a second prepare_execution replaced a sandbox's policy (method SANDBOX)",
    "sandbox_removed": "a sandbox was released, or its prepare failed (method SANDBOX)",
    "command_not_supported": "SOCKS5: BIND or UDP ASSOCIATE (reply 0x07)",
    "address_type_not_supported": "SOCKS5: an unknown address type (reply 0x08)",
    "not_redirected": "transparent: no original destination on a redirected connection",
    "not_a_name": "DNS: the name asked is an address spelling (NXDOMAIN)",
    "address_rules": "DNS: answered because address rules may allow the name once resolved",
    "pool_exhausted": "DNS: the sandbox's fake-address pool is full (SERVFAIL)",
}

# Sub-reasons the proxy puts in `detail` for reason "reserved_address".
RESERVED_KINDS: Final = (
    "loopback",
    "link_local",
    "host_local",
    "metadata",
    "private",
    "reserved_extra",
)

# A field whose name contains one of these (case-insensitive) is dropped from the record.
# Bodies too: a body is never logged, whatever its field is called.
_SECRET_KEY = re.compile(r"authoriz|cookie|token|passw|secret|api[-_]?key|body|payload",
                         re.IGNORECASE)
# Fields that may hold a URL or a request target; their query string is redacted.
URL_FIELDS: Final = frozenset({"path", "url", "target", "uri"})
_URL_FIELDS_TUPLE: Final = tuple(sorted(URL_FIELDS))
# The writer appends these; a caller's own are dropped so a line never carries two.
CHAIN_FIELDS: Final = frozenset({"seq", "prev"})
REDACTED_QUERY: Final = "?REDACTED"

# The JSON encoder of the hot path: the C encoder built once (json.dumps builds a new
# encoder per call when given separators, which costs ~2 µs here). `default=str` makes any
# odd value (an IPv4Address, an enum) a string instead of an exception.
_c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
_py_encoder = json.JSONEncoder(separators=(",", ":"), default=str, allow_nan=False)
_c_encode = (
    None
    if _c_make_encoder is None
    else _c_make_encoder(None, str, encode_basestring_ascii, None, ":", ",", False, False, False)
)


def encode_record(record: dict[str, object]) -> str:
    """Serialize `record` as compact ASCII JSON; raises ValueError on NaN or infinity."""
    if _c_encode is None:  # pragma: no cover - CPython always has the C encoder
        return _py_encoder.encode(record)
    return "".join(_c_encode(record, 0))


class Clock:
    """RFC 3339 UTC timestamps with milliseconds, `2026-11-30T05:01:02.123Z`.

    The second-resolution prefix is cached, so a call costs one `time.time()` and one
    small format; no datetime objects on the hot path.
    """

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""
        self._milli = -1
        self._text = ""

    def now(self) -> str:
        milli = int(time.time() * 1000)
        if milli != self._milli:  # under load many events share a millisecond
            self._milli = milli
            self._text = self._format(milli)
        return self._text

    def format(self, t: float) -> str:
        return self._format(int(t * 1000))

    def _format(self, milli: int) -> str:
        second, fraction = divmod(milli, 1000)
        if second != self._second:
            self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = second
        return f"{self._prefix}.{fraction:03d}Z"


class Redactor:
    """Drops secret-named fields and redacts query strings; memoizes the key decisions."""

    def __init__(self, keep_query: bool = False) -> None:
        self.keep_query = keep_query
        self._safe: set[str] = set()

    def _unsafe(self, key: str) -> bool:
        if key in self._safe:
            return False
        if key in CHAIN_FIELDS or _SECRET_KEY.search(key):
            return True
        if len(self._safe) < 4096:  # bound the memo against odd callers
            self._safe.add(key)
        return False

    def redact(self, record: dict[str, object]) -> None:
        """Redact `record` in place (the fast path is one C-level subset test)."""
        if not self._safe.issuperset(record):
            secret = [key for key in record if self._unsafe(key)]
            for key in secret:
                del record[key]
        if self.keep_query:
            return
        for key in _URL_FIELDS_TUPLE:
            value = record.get(key)
            if value.__class__ is str:
                record[key] = redact_url(value)


def redact_url(value: str) -> str:
    """`/a?token=x` -> `/a?REDACTED`; also drops `user:pass@` from an absolute URL."""
    cut = value.find("?")
    if cut >= 0:
        value = value[:cut] + REDACTED_QUERY
    scheme_end = value.find("://")
    if scheme_end >= 0:
        rest = value[scheme_end + 3 :]
        at = rest.find("@")
        slash = rest.find("/")
        if at >= 0 and (slash < 0 or at < slash):
            value = value[: scheme_end + 3] + rest[at + 1 :]
    return value


def line_hash(line: bytes) -> str:
    """The `prev` that the line after `line` carries."""
    return hashlib.sha256(line).hexdigest()


def chain_line(body: str, seq: int, prev: str) -> bytes:
    """Append `seq` and `prev` to the serialized object `body`; returns the line, no newline."""
    sep = "," if len(body) > 2 else ""
    return f'{body[:-1]}{sep}"seq":{seq},"prev":"{prev}"}}'.encode("ascii")


# ---- time bounds for the reviewer -------------------------------------------------------

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h|d|w)$", re.IGNORECASE)
_UNIT_SECONDS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
# The writer's own format, fixed-width, so it compares correctly as a string.
_CANONICAL_TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def parse_time_bound(text: str, now: datetime) -> datetime:
    """RFC 3339 (`2026-11-30T05:00:00Z`, offsets, a bare date) or relative (`90s`, `15m`,
    `1h`, `2d`, `1w` before `now`). Raises ValueError naming the text."""
    match = _RELATIVE.match(text.strip())
    if match:
        seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2).lower()]
        return now - timedelta(seconds=seconds)
    try:
        parsed = datetime.fromisoformat(text.strip().replace("z", "Z"))
    except ValueError:
        raise ValueError(f"not an RFC 3339 time or a duration like 1h: {text!r}") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def canonical_ts(moment: datetime) -> str:
    """`moment` in the writer's format, for string comparison against `ts` fields."""
    moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def normalize_ts(value: object) -> str | None:
    """A record's `ts` in the canonical form, or None when it is missing or unparseable."""
    if not isinstance(value, str):
        return None
    if _CANONICAL_TS.match(value):
        return value
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return canonical_ts(parsed)


# ---- the verifier ------------------------------------------------------------------------

HASH_WINDOW: Final = 4096  # hashes remembered by seq, to check a reordered line's prev


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
    hashes: OrderedDict[int, tuple[str, str]] = field(default_factory=OrderedDict)
    missing: list[tuple[int, int, str]] = field(default_factory=list)  # lo, hi, where


@dataclass
class VerifyResult:
    problems: list[Problem]
    warnings: list[Problem]
    lines: int
    runs: int
    requests: int
    head: str | None  # SHA-256 of the last line: compare with a value kept out of band


class ChainVerifier:
    """Feed lines in order with `feed`, then call `finish`. Pure and streaming.

    `live=True` accepts a final run without an end record (a log still being written).
    """

    def __init__(self, *, live: bool = False) -> None:
        self.live = live
        self.problems: list[Problem] = []
        self.warnings: list[Problem] = []
        self._run: _Run | None = None
        self._prev_line: bytes | None = None
        self._prev_bad = False
        self._lines = 0
        self._runs = 0
        self._requests = 0

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
            self._run.last_seq += 1
            self._remember(self._run.last_seq, line_hash(line), where)
        self._prev_line = line
        self._prev_bad = True

    def _start(self, where: str, line: bytes, record: dict[str, object]) -> None:
        self._end_run(where)
        self._runs += 1
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
            self._fail(where, "run start links to earlier lines that were not given "
                       "(deleted, or older files not passed)")
        self._run = _Run(run_id=str(record.get("run", "?")), where=where)
        self._remember(0, line_hash(line), where)

    def _link(self, where: str, line: bytes, record: dict[str, object]) -> None:
        run = self._run
        seq = record["seq"]
        assert isinstance(seq, int)
        if run is None:
            self._fail(
                where, "chain does not begin with a start record (earlier lines or files missing?)"
            )
            run = self._run = _Run(run_id="?", where=where, last_seq=seq)
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
        if kind in REQUEST_TYPES:
            self._run.requests += 1
            self._requests += 1
        elif kind == "end":
            self._run.ended = True
            if record.get("lines") != record["seq"]:
                self._fail(
                    where,
                    f"end record says lines={record.get('lines')} but has seq {record['seq']}",
                )

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
            self.problems, self.warnings, self._lines, self._runs, self._requests, head
        )

    def _fail(self, where: str, message: str) -> None:
        self.problems.append(Problem(where, message))

    def _warn(self, where: str, message: str) -> None:
        self.warnings.append(Problem(where, message))


def utc_now() -> datetime:
    return datetime.now(UTC)

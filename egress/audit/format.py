"""The audit record format: field conventions, line encoding, timestamps, the hash chain,
and the names of rotated files.

Pure: stdlib only (no asyncio, no sockets, no files), shared by the writer (`log.py`,
`writer.py`, on the proxy's hot path) and the reviewer tooling (`read.py`, `verify.py`,
`cli.py`). Redaction is `redact.py`, the verifier `verify.py`, the CLI's time bounds
`timebounds.py`.

The chain, exactly (docs/audit-log.md#tamper-evidence-the-hash-chain repeats it for reviewers):

- A line is one JSON object, serialized without spaces, ASCII only, followed by `\\n`.
- Every line carries `seq` (an integer) and `prev` (64 hex digits) as its last two fields.
- A run begins with a start record `{"type": "start", "run": <random 128-bit hex>, "seq": 0,
  ...}` whose `prev` is the SHA-256 of the last line that was already in the file when the
  run opened it, or `"0" * 64` when the file was empty or new.
- Every other line has `seq` = previous line's `seq` + 1 and `prev` = hex SHA-256 of the
  previous line's exact bytes (without its newline). The chain runs on across rotated files.
- A clean run ends with `{"type": "end", "lines": N, "seq": N, ...}`.
"""

from __future__ import annotations

import hashlib
import json
import json.encoder
import re
import time
from json.encoder import encode_basestring_ascii
from typing import Final

GENESIS: Final = "0" * 64
FORMAT: Final = "egress-audit/1"

# Record types. A line without "type" (or with type "request") is one request or tunnel.
REQUEST_TYPES: Final = frozenset({None, "request"})
CONTROL_TYPES: Final = frozenset(
    {"start", "end", "rotate", "reopen", "loss", "outage", "recovered", "policy", "suppressed"}
)
# Records linked to a request record by its `id`: `open` when the upstream is contacted,
# `progress` at an interval while it lasts (docs/audit-log.md#open-and-progress-records).
LINKED_TYPES: Final = frozenset({"open", "progress"})
# Lifecycle records have a request record's shape but are no request: a sandbox bound,
# replaced or released (SANDBOX), the cut's probe of a listener (PROBE). The reviewer's tools
# count and show them apart (docs/audit-log.md#sandbox-records).
LIFECYCLE_METHODS: Final = frozenset({"SANDBOX", "PROBE"})

# The reason codes, decisions and tunnel ends are one vocabulary: `egress.reasons`.

# The writer appends these; a caller's own are dropped so a line never carries two.
CHAIN_FIELDS: Final = frozenset({"seq", "prev"})

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
    small format; no datetime objects on the hot path. One clock serves the event loop and
    the writer thread (docs/audit-log.md#timestamps): each cache is one tuple, replaced
    whole, so a reader on another thread never sees half of an update.
    """

    def __init__(self) -> None:
        self._second: tuple[int, str] = (-1, "")
        self._milli: tuple[int, str] = (-1, "")

    def now(self) -> str:
        milli = int(time.time() * 1000)
        cached = self._milli
        if milli == cached[0]:  # under load many events share a millisecond
            return cached[1]
        text = self._format(milli)
        self._milli = (milli, text)
        return text

    def format(self, t: float) -> str:
        return self._format(int(t * 1000))

    def _format(self, milli: int) -> str:
        second, fraction = divmod(milli, 1000)
        cached = self._second
        if second == cached[0]:
            prefix = cached[1]
        else:
            prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = (second, prefix)
        return f"{prefix}.{fraction:03d}Z"


def line_hash(line: bytes) -> str:
    """The `prev` that the line after `line` carries."""
    return hashlib.sha256(line).hexdigest()


def record_ts(body: str) -> str | None:
    """The `ts` of a serialized record that begins with it (as `AuditLog.record` writes
    them), else None."""
    if body.startswith('{"ts":"'):
        end = body.find('"', 7)
        if end > 7:
            return body[7:end]
    return None


def unchain_line(line: bytes) -> tuple[str, int, str] | None:
    """(body, seq, prev) of a chained line: `chain_line` undone; None if it is not one."""
    at = line.rfind(b'"seq":')
    if at < 1 or not line.endswith(b'"}') or len(line) < at + 80:
        return None
    try:
        seq = int(line[at + 6 : line.index(b",", at)])
    except ValueError:
        return None
    prev = line[-66:-2].decode("ascii", "replace")
    head = line[: at - 1] if line[at - 1 : at] == b"," else line[:at]
    return head.decode("ascii", "replace") + "}", seq, prev


def chain_line(body: str, seq: int, prev: str) -> bytes:
    """Append `seq` and `prev` to the serialized object `body`; returns the line, no newline."""
    sep = "," if len(body) > 2 else ""
    return f'{body[:-1]}{sep}"seq":{seq},"prev":"{prev}"}}'.encode("ascii")


# ---- rotated files: PATH.1.gz is the newest, PATH.N.gz the oldest (docs/audit-log.md) ----

_ROTATED = re.compile(r"^(?P<base>.+)\.(?P<index>\d+)(?:\.gz)?$")


def rotated_name(path: str, index: int, *, compressed: bool = True) -> str:
    """The name of `path`'s rotated file number `index` (1 = newest)."""
    return f"{path}.{index}.gz" if compressed else f"{path}.{index}"


def rotation_of(name: str) -> tuple[str, int] | None:
    """(base path, index) if `name` is a rotated file's name (`P.3.gz`, `P.3`), else None."""
    match = _ROTATED.match(name)
    return (match["base"], int(match["index"])) if match else None

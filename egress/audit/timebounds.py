"""Time bounds for the reviewer commands (`--since`, `--until`): pure parsing.

`5m`, `2h`, `1d` (relative to now), or an RFC 3339 time; compared with the writer's own
fixed-width timestamps as strings (docs/audit-log.md#reading-the-log).

Pure: text in, times out.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Final

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


def utc_now() -> datetime:
    return datetime.now(UTC)

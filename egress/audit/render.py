"""Rendering for `egress audit`: the summary tables and one line per event for `tail`/`filter`
(docs/audit-log.md#the-reviewers-commands).

No I/O of its own: records and summaries in, text out. Text from the log is untrusted (an
agent chooses hosts and paths), so every field printed to a terminal goes through
`printable`, which escapes control characters and bidirectional overrides instead of letting
them reach the reader's terminal.
"""

from __future__ import annotations

import json

from egress.audit.format import CONTROL_TYPES, LIFECYCLE_METHODS, LINKED_TYPES
from egress.audit.read import DIMENSIONS, Summary
from egress.printable import printable


def render_summary(summary: Summary, top: int | None, header: list[str]) -> str:
    allow, block, error, other = summary.totals
    lifecycle = sum(summary.lifecycle.values())
    lines = [
        *header,
        f"events: {sum(summary.totals)}  block: {block}  allow: {allow}  error: {error}"
        + (f"  other: {other}" if other else "")
        + (f"  (and {lifecycle} lifecycle records)" if lifecycle else ""),
        f"from {summary.first_ts or '-'} to {summary.last_ts or '-'}"
        f"  runs: {summary.runs}"
        + (f"  unreadable lines: {summary.bad_lines}" if summary.bad_lines else ""),
    ]
    if summary.open_at_crash_count:  # opened, no end record, run ended without one
        lines.append(f"open at crash: {summary.open_at_crash_count} (no end record)")
        for rec in summary.open_at_crash[: top or 15]:
            who = rec.get("client_id") or rec.get("client")
            lines.append(
                printable(
                    f"  {rec.get('ts')} id {rec.get('id')} {rec.get('host')}:"
                    f"{rec.get('port')} from {who}"
                )
            )
    titles = {
        "host": "host",
        "domain": "registrable domain",
        "client": "client",
        "reason": "reason",
        "rule": "rule",
    }
    for dimension in DIMENSIONS:
        rows, hidden = summary.rows(dimension, top)
        lines += ["", f"By {titles[dimension]}:"]
        lines += _table(rows, titles[dimension].upper())
        if hidden:
            lines.append(f"  ... and {hidden} more (--top N, or --json for all)")
    lines += ["", "Sandbox lifecycle (not requests, not counted above):"]
    lines += _lifecycle_table(summary.lifecycle_rows())
    return "\n".join(lines)


def _lifecycle_table(rows: list[dict[str, object]]) -> list[str]:
    if not rows:
        return ["  (none)"]
    width = max(len("COUNT"), *(len(str(r["count"])) for r in rows))
    event = max(len("EVENT"), *(len(str(r["event"])) for r in rows))
    head = f"  {'COUNT'.rjust(width)}  {'EVENT'.ljust(event)}  SANDBOX"
    body = [
        f"  {str(r['count']).rjust(width)}  {printable(str(r['event'])).ljust(event)}"
        f"  {printable(str(r['sandbox']))}"
        for r in rows
    ]
    return [head, *body]


def _table(rows: list[dict[str, object]], key_title: str) -> list[str]:
    if not rows:
        return ["  (none)"]
    columns = ("block", "allow", "error", "total")
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in columns}
    head = "  " + "  ".join(c.upper().rjust(widths[c]) for c in columns) + "  " + key_title
    body = [
        "  "
        + "  ".join(str(r[c]).rjust(widths[c]) for c in columns)
        + f"  {printable(str(r['key']))}"
        for r in rows
    ]
    return [head, *body]


# ---- one readable line an event ------------------------------------------------------------


def format_event(record: dict[str, object]) -> str:
    """`TS DECISION METHOD TARGET from CLIENT REASON [rule=..] [status=..] ... -- detail`."""
    kind = record.get("type")
    if kind in CONTROL_TYPES or kind in LINKED_TYPES:  # open/progress too (--control)
        extras = " ".join(
            f"{k}={_value(v)}" for k, v in record.items() if k not in ("type", "ts", "prev")
        )
        return printable(f"{record.get('ts', '-')} --- {kind} {extras}")
    if kind in (None, "request") and record.get("method") in LIFECYCLE_METHODS:
        return _lifecycle_event(record)
    host, port = record.get("host"), record.get("port")
    # no destination (a connection record, origin-form): `-`, not `:0`
    target = f"{host}:{port}" if host and port is not None else str(host or "-")
    if record.get("path") is not None:
        target += str(record["path"])
    parts = [
        str(record.get("ts", "-")),
        f"{record.get('decision', '-'):<5}",
        str(record.get("method", "-")),
        target,
        "from",
        str(record.get("client", "-")),
    ]
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
    return printable(" ".join(parts))


def _value(value: object) -> str:
    """A field's value as the log spells it (`null`, `false`, `{"a":1}`), not Python's."""
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), default=str)


def _lifecycle_event(record: dict[str, object]) -> str:
    """`TS --- sandbox_removed SANDBOX (client_id) -- released`: not a request line."""
    what = str(record.get("host", "-"))
    if record.get("method") == "PROBE":
        what = f"{what}:{record.get('port')} from {record.get('client', '-')}"
    parts = [str(record.get("ts", "-")), "---", str(record.get("reason", "-")), what]
    if record.get("client_id"):
        parts.append(f"({record['client_id']})")
    if record.get("detail"):
        parts.append(f"-- {record['detail']}")
    return printable(" ".join(parts))


# ---- the commands ------------------------------------------------------------------------


__all__ = ["format_event", "printable", "render_summary"]

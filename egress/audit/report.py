"""`egress audit report --html`: one self-contained HTML page for a reviewer
(docs/audit-log.md#egress-audit-report).

Strategy: the page is built from what one streaming pass keeps (`ReportData`, in
`digest.py`), so memory is bounded by distinct values, never by lines; its tables are
`sections.py`'s, this module the page around them. The chain's verify result is computed by
the caller and shown first: a report of a doctored log is worth nothing.

The page has no script, no font, no stylesheet or image from anywhere: inline CSS and inline
SVG only, so it opens offline and from an attachment. Everything from the log is untrusted
(an agent chooses hosts and paths): every field goes through `html_text` (terminal-control
and bidi characters escaped as by `printable`, then HTML-escaped, quotes included).

No I/O of its own: records in, text out (their vocabulary, `Summary` and the record
kinds, is `read.py`'s, whose readers open files).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from egress.audit.digest import (
    KINDS,
    MAX_CLIENT_HOSTS,
    MAX_DETAIL,
    MAX_ERRORS,
    MAX_LIFECYCLE,
    MAX_POLICIES,
    MAX_PORTS,
    MAX_SLICES,
    ClientRow,
    ErrorRow,
    Reached,
    ReportData,
    kind_of,
)
from egress.audit.sections import (
    COLUMNS,
    MAX_ROWS,
    MAX_TIMELINES,
    blocked_hosts_section,
    clients_section,
    errors_section,
    html_text,
    kinds_section,
    lifecycle_section,
    policies_section,
    reached_section,
    refusals_section,
    timelines_section,
)


@dataclass
class Verified:
    """The chain's verify result, as `egress audit verify` prints it."""

    ok: bool
    verdict: str  # the last line: `OK: ...` or `FAILED: ...`
    problems: list[str] = field(default_factory=list)


_CSS: Final = """
body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222;max-width:1200px}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;margin:.5em 0}td,th{padding:2px 8px;text-align:left;
border-bottom:1px solid #eee;vertical-align:top}td.n,th.n{text-align:right}
.ok{background:#e8f5e9;border:1px solid #2e7d32;padding:.6em}
.failed{background:#ffebee;border:1px solid #c62828;padding:.6em}
code{font-family:ui-monospace,monospace;word-break:break-all}.more{color:#666}
.legend span{display:inline-block;width:10px;height:10px;margin:0 4px 0 12px}
tr.error td:first-child,tr.error-row td:first-child{border-left:4px solid #ef6c00}
tr.block td:first-child{border-left:4px solid #c62828}
tr.reached-host td:first-child{border-left:4px solid #2e7d32}
.detail{color:#555;font-size:.9em}tr.client td:first-child code{white-space:nowrap}
.legend span.error-key{background:#ffb74d;outline:1px dashed #e65100}
"""


def render_html(
    data: ReportData,
    verified: Verified,
    files: list[str],
    domain_of: Callable[[str], str],
) -> str:
    """The whole page."""
    s = data.summary
    allow, block, error, _ = s.totals
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>egress audit report</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>egress audit report</h1>",
        _verify_section(verified),
        "<p>Files: " + ", ".join(f"<code>{html_text(f)}</code>" for f in files) + "</p>",
        '<table id="totals"><tr>'
        + "".join(
            f'<th class="n">{name}</th>'
            for name in ("requests", "block", "allow", "error", "lifecycle", "runs")
        )
        + "</tr><tr>"
        + "".join(
            f'<td class="n" data-count="{name}">{value}</td>'
            for name, value in (
                ("requests", sum(s.totals)),
                ("block", block),
                ("allow", allow),
                ("error", error),
                ("lifecycle", sum(s.lifecycle.values())),
                ("runs", s.runs),
            )
        )
        + "</tr></table>",
        f"<p>From <code>{html_text(s.first_ts or '-')}</code> to "
        f"<code>{html_text(s.last_ts or '-')}</code>"
        + (f"; {s.bad_lines} unreadable line(s)" if s.bad_lines else "")
        + "</p>",
        kinds_section(data),
        timelines_section(data),
        clients_section(data),
        reached_section(data),
        blocked_hosts_section(data, domain_of),
        errors_section(data),
        refusals_section(s),
        policies_section(data),
        lifecycle_section(data),
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def _verify_section(v: Verified) -> str:
    cls = "ok" if v.ok else "failed"
    lines = [f'<div id="verify" class="{cls}" data-ok="{str(v.ok).lower()}">']
    lines.append(f"<strong>Hash chain: {'verified' if v.ok else 'FAILED'}</strong><br>")
    lines.append(f"<code>{html_text(v.verdict)}</code>")
    if v.problems:
        lines.append("<ul>" + "".join(f"<li>{html_text(p)}</li>" for p in v.problems) + "</ul>")
    lines.append("</div>")
    return "\n".join(lines)


__all__ = [
    "COLUMNS",
    "KINDS",
    "MAX_CLIENT_HOSTS",
    "MAX_DETAIL",
    "MAX_ERRORS",
    "MAX_LIFECYCLE",
    "MAX_POLICIES",
    "MAX_PORTS",
    "MAX_ROWS",
    "MAX_SLICES",
    "MAX_TIMELINES",
    "ClientRow",
    "ErrorRow",
    "Reached",
    "ReportData",
    "Verified",
    "kind_of",
    "render_html",
]

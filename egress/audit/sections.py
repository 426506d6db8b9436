"""The tables of `egress audit report`'s page, one function per section
(docs/audit-log.md#egress-audit-report).

Strategy: each section is built from `ReportData` (`digest.py`), at most `MAX_ROWS` rows per
table and `MAX_TIMELINES` timelines, the rest counted. Everything from the log is untrusted
(an agent chooses hosts and paths): every field goes through `html_text` (terminal-control and
bidi characters escaped as by `printable`, then HTML-escaped, quotes included). Inline SVG
only: the page opens offline.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Final

from egress.audit.digest import KINDS, ReportData
from egress.audit.read import Summary
from egress.printable import printable

MAX_TIMELINES: Final = 50  # clients with a timeline (busiest first); the rest counted
MAX_ROWS: Final = 200  # rows per table; the rest counted
COLUMNS: Final = 60  # bars per timeline
_KIND_TITLES: Final = {
    "request": "plain-HTTP requests",
    "tunnel": "tunnels (CONNECT, SOCKS5, transparent, forwarder)",
    "dns": "DNS queries (transparent mode)",
    "nowhere": "no destination (refused before a request, malformed target)",
}
_PAD: Final = {19: "", 16: ":00", 13: ":00:00", 10: "T00:00:00"}
# allow, block, error: errors are no refusal by the policy, so never in a block's red
_COLORS: Final = ("#2e7d32", "#c62828", "#ef6c00")


def html_text(value: object) -> str:
    """A log field as HTML text: one line, no terminal controls, every markup char escaped."""
    return html.escape(printable(str(value)), quote=True)


def timelines_section(data: ReportData) -> str:
    out = [
        '<h2 id="timelines">Decisions over time, per execution or sandbox</h2>',
        '<p class="legend">'
        + "".join(
            f'<span style="background:{c}"></span>{n}'
            for n, c in zip(("allow", "block", "error"), _COLORS, strict=True)
        )
        + "</p>",
    ]
    if not data.timeline:
        return "\n".join([*out, "<p>(no requests)</p>"])
    pad = _PAD[data.resolution]
    moments = {key: _epoch(key + pad) for per in data.timeline.values() for key in per}
    first, last = min(moments.values()), max(moments.values())
    step = {19: 1, 16: 60, 13: 3600}.get(data.resolution, 86400)
    columns = min(COLUMNS, (last - first) // step + 1)
    width = max(step, -(-(last - first + step) // columns))  # seconds per bar
    busiest = sorted(
        data.timeline.items(), key=lambda kv: (-sum(sum(c) for c in kv[1].values()), kv[0])
    )
    start, end = min(moments, key=moments.__getitem__), max(moments, key=moments.__getitem__)
    out.append(
        f"<p>{html_text(start + pad)}Z to {html_text(end + pad)}Z, {_duration(width)} per bar, "
        "all clients on one time axis.</p>"
    )
    out.append('<table class="timelines">')
    for client, per in busiest[:MAX_TIMELINES]:
        bars = [[0, 0, 0] for _ in range(columns)]
        for key, counts in per.items():
            column = bars[min(columns - 1, (moments[key] - first) // width)]
            for slot in range(3):
                column[slot] += counts[slot]
        totals = [sum(col[slot] for col in bars) for slot in range(3)]
        out.append(
            f'<tr class="timeline" data-client="{html_text(client)}" '
            f'data-block="{totals[1]}" data-allow="{totals[0]}" data-error="{totals[2]}">'
            f"<td><code>{html_text(client)}</code><br>{totals[1]} block, {totals[0]} allow, "
            f"{totals[2]} error</td><td>{_bars_svg(bars)}</td></tr>"
        )
    out.append("</table>")
    if len(busiest) > MAX_TIMELINES:
        out.append(f'<p class="more">... and {len(busiest) - MAX_TIMELINES} more clients</p>')
    return "\n".join(out)


def _epoch(text: str) -> int:
    """`2026-11-30T05:22:07` (UTC) as whole seconds since the epoch; 0 if not a time."""
    try:
        moment = datetime.fromisoformat(text).replace(tzinfo=UTC)
    except ValueError:
        return 0
    return int(moment.timestamp())


def _duration(seconds: int) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


def _bars_svg(bars: list[list[int]]) -> str:
    """Stacked bars (allow, block, error) per column, as inline SVG."""
    width, height, bar = 8 * len(bars), 40, 7
    peak = max((sum(col) for col in bars), default=0) or 1
    rects = []
    for i, col in enumerate(bars):
        y = float(height)
        for slot in (0, 2, 1):  # blocks on top, where the eye goes
            if col[slot]:
                h = max(1.0, height * col[slot] / peak)
                y -= h
                rects.append(
                    f'<rect x="{i * 8}" y="{y:.1f}" width="{bar}" height="{h:.1f}" '
                    f'fill="{_COLORS[slot]}"><title>{col[slot]}</title></rect>'
                )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'role="img" aria-label="decisions over time">{"".join(rects)}</svg>'
    )


def blocked_hosts_section(data: ReportData, domain_of: Callable[[str], str]) -> str:
    out = ['<h2 id="blocked">Blocked hosts</h2>']
    hosts = sorted(data.blocked.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))
    if not hosts:
        return "\n".join([*out, "<p>(none)</p>"])
    out.append(
        '<table id="blocked-hosts"><tr><th class="n">blocks</th><th>host</th>'
        "<th>reasons and rules</th></tr>"
    )
    for host, hits in hosts[:MAX_ROWS]:
        detail = "<br>".join(
            f"{n} {html_text(reason)}" + (f" <code>{html_text(rule)}</code>" if rule else "")
            for (reason, rule), n in sorted(hits.items(), key=lambda kv: (-kv[1], kv[0]))
        )
        out.append(
            f'<tr class="blocked-host" data-host="{html_text(host)}" '
            f'data-blocks="{sum(hits.values())}"><td class="n">{sum(hits.values())}</td>'
            f"<td><code>{html_text(host)}</code></td><td>{detail}</td></tr>"
        )
    out.append("</table>")
    if len(hosts) > MAX_ROWS:
        out.append(f'<p class="more">... and {len(hosts) - MAX_ROWS} more hosts</p>')
    domains: dict[str, int] = {}
    for host, hits in hosts:
        key = domain_of(host)
        domains[key] = domains.get(key, 0) + sum(hits.values())
    out.append('<h2 id="blocked-domains-title">Blocked registrable domains</h2>')
    out.append('<table id="blocked-domains"><tr><th class="n">blocks</th><th>domain</th></tr>')
    ranked = sorted(domains.items(), key=lambda kv: (-kv[1], kv[0]))
    for domain, n in ranked[:MAX_ROWS]:
        out.append(
            f'<tr class="blocked-domain" data-domain="{html_text(domain)}" data-blocks="{n}">'
            f'<td class="n">{n}</td><td><code>{html_text(domain)}</code></td></tr>'
        )
    out.append("</table>")
    if len(ranked) > MAX_ROWS:
        out.append(f'<p class="more">... and {len(ranked) - MAX_ROWS} more domains</p>')
    return "\n".join(out)


def refusals_section(s: Summary) -> str:
    """Blocks and errors by reason: a block's bar in solid red, an error's in light orange
    with a dashed outline (an error is no refusal by the policy: a name that did not
    resolve, a malformed head)."""
    out = [
        '<h2 id="refusals-title">Refusals and errors by reason</h2>',
        '<p class="legend"><span style="background:#c62828"></span>block (the policy, the '
        'address guard, the SNI check)<span class="error-key"></span>error (resolution, '
        "connection, malformed requests, limits)</p>",
    ]
    rows = [
        (key, word, counts[slot])
        for key, counts in s.tables["reason"].items()
        for word, slot in (("block", 1), ("error", 2))
        if counts[slot]
    ]
    rows.sort(key=lambda row: (-row[2], row[0], row[1]))
    if not rows:
        return "\n".join([*out, "<p>(none)</p>"])
    peak = rows[0][2]
    out.append(
        '<table id="refusals"><tr><th class="n">count</th><th>decision</th><th>reason</th>'
        "<th></th></tr>"
    )
    for reason, word, n in rows[:MAX_ROWS]:
        out.append(
            f'<tr class="refusal {word}" data-reason="{html_text(reason)}" data-decision="{word}" '
            f'data-count="{n}"><td class="n">{n}</td><td>{word}</td>'
            f"<td><code>{html_text(reason)}</code></td><td>{_bar(n, peak, word)}</td></tr>"
        )
    out.append("</table>")
    return "\n".join(out)


def _bar(n: int, peak: int, word: str) -> str:
    width = max(1, round(300 * n / peak))
    if word == "error":  # orange with a dashed outline: never mistaken for a block's red
        fill = (
            f'<rect x="0.5" y="0.5" width="{max(1, width - 1)}" height="11" fill="#ffb74d" '
            'stroke="#e65100" stroke-dasharray="3 2"/>'
        )
    else:
        fill = f'<rect width="{width}" height="12" fill="{_COLORS[1]}"/>'
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="300" height="12" role="img" '
        f'aria-label="{n} {word}">{fill}</svg>'
    )


def kinds_section(data: ReportData) -> str:
    """Tunnels apart from plain-HTTP requests (and DNS queries, and what had no
    destination), by decision."""
    out = [
        '<h2 id="kinds-title">Tunnels and requests</h2>',
        '<table id="kinds"><tr><th>kind</th><th class="n">allow</th><th class="n">block</th>'
        '<th class="n">error</th><th class="n">total</th></tr>',
    ]
    for kind in KINDS:
        allow, block, error = data.kinds[kind]
        out.append(
            f'<tr class="kind" data-kind="{kind}" data-allow="{allow}" data-block="{block}" '
            f'data-error="{error}"><td>{_KIND_TITLES[kind]}</td><td class="n">{allow}</td>'
            f'<td class="n">{block}</td><td class="n">{error}</td>'
            f'<td class="n">{allow + block + error}</td></tr>'
        )
    out.append("</table>")
    return "\n".join(out)


def clients_section(data: ReportData) -> str:
    """One row per client: its requests and tunnels, decisions, bytes, hosts reached."""
    out = ['<h2 id="clients-title">Clients</h2>']
    rows = sorted(data.clients.items(), key=lambda kv: (-sum(kv[1].kinds), kv[0]))
    if not rows:
        return "\n".join([*out, "<p>(no requests)</p>"])
    heads = "requests,tunnels,DNS,no dest.,allow,block,error,bytes up,bytes down".split(",")
    out.append(
        '<table id="clients"><tr><th>client</th>'
        + "".join(f'<th class="n">{h}</th>' for h in heads)
        + "<th>hosts reached (allowed records)</th></tr>"
    )
    for client, row in rows[:MAX_ROWS]:
        numbers = [*row.kinds, *row.decisions, row.bytes_up, row.bytes_down]
        top = sorted(row.hosts.items(), key=lambda kv: (-kv[1], kv[0]))
        reached = ", ".join(f"<code>{html_text(h)}</code> {n}" for h, n in top[:10])
        more = len(top) - 10
        if more > 0 or row.hosts_more:
            reached += f' <span class="more">and {max(more, 0)} more hosts'
            reached += f" (+{row.hosts_more} records)</span>" if row.hosts_more else "</span>"
        out.append(
            f'<tr class="client" data-client="{html_text(client)}" data-requests="{row.kinds[0]}" '
            f'data-tunnels="{row.kinds[1]}" data-allow="{row.decisions[0]}" '
            f'data-block="{row.decisions[1]}" data-error="{row.decisions[2]}" '
            f'data-hosts="{len(row.hosts)}"><td><code>{html_text(client)}</code></td>'
            + "".join(f'<td class="n">{n}</td>' for n in numbers)
            + f"<td>{reached or '-'}</td></tr>"
        )
    out.append("</table>")
    if len(rows) > MAX_ROWS:
        out.append(f'<p class="more">... and {len(rows) - MAX_ROWS} more clients</p>')
    return "\n".join(out)


def reached_section(data: ReportData) -> str:
    """What the agent actually reached: every allowed host, busiest first."""
    out = ['<h2 id="reached-title">Reached hosts (allowed)</h2>']
    hosts = sorted(data.reached.items(), key=lambda kv: (-sum(kv[1].kinds), kv[0]))
    if not hosts:
        return "\n".join([*out, "<p>(none)</p>"])
    out.append(
        '<table id="reached-hosts"><tr><th>host</th><th class="n">requests</th>'
        '<th class="n">tunnels</th><th class="n">DNS</th><th>ports</th>'
        '<th class="n">bytes up</th><th class="n">bytes down</th></tr>'
    )
    for host, seen in hosts[:MAX_ROWS]:
        ports = ", ".join(str(p) for p in sorted(seen.ports))
        out.append(
            f'<tr class="reached-host" data-host="{html_text(host)}" '
            f'data-allows="{sum(seen.kinds)}" data-requests="{seen.kinds[0]}" '
            f'data-tunnels="{seen.kinds[1]}"><td><code>{html_text(host)}</code></td>'
            + "".join(f'<td class="n">{n}</td>' for n in seen.kinds)
            + f'<td>{ports}</td><td class="n">{seen.bytes_up}</td>'
            f'<td class="n">{seen.bytes_down}</td></tr>'
        )
    out.append("</table>")
    if len(hosts) > MAX_ROWS:
        out.append(f'<p class="more">... and {len(hosts) - MAX_ROWS} more hosts</p>')
    return "\n".join(out)


def errors_section(data: ReportData) -> str:
    """Errors (a name that did not resolve, an upstream that refused, a malformed request,
    a limit) by reason and destination, with the first one's detail."""
    out = ['<h2 id="errors-title">Errors</h2>']
    rows = sorted(data.errors.items(), key=lambda kv: (-kv[1].count, kv[0]))
    if not rows:
        return "\n".join([*out, "<p>(none)</p>"])
    out.append(
        '<table id="errors"><tr><th class="n">count</th><th>reason</th><th>destination</th>'
        "<th>first detail</th></tr>"
    )
    for (reason, where), row in rows[:MAX_ROWS]:
        out.append(
            f'<tr class="error-row" data-reason="{html_text(reason)}" '
            f'data-where="{html_text(where)}" '
            f'data-count="{row.count}"><td class="n">{row.count}</td>'
            f"<td><code>{html_text(reason)}</code></td><td><code>{html_text(where)}</code></td>"
            f'<td class="detail">{html_text(row.detail)}</td></tr>'
        )
    out.append("</table>")
    hidden = len(rows) - min(len(rows), MAX_ROWS)
    if hidden or data.errors_more:
        out.append(
            f'<p class="more">... and {hidden} more rows'
            + (f", {data.errors_more} more errors not itemized" if data.errors_more else "")
            + "</p>"
        )
    return "\n".join(out)


def policies_section(data: ReportData) -> str:
    out = ['<h2 id="policies-title">Policy changes</h2>']
    if not data.policies:
        return "\n".join([*out, "<p>(no policy records)</p>"])
    out.append(
        '<table id="policies"><tr><th>time</th><th>client</th><th>source</th><th>hash</th>'
        "<th>policy</th></tr>"
    )
    for record in data.policies:
        client = record.get("client_id")
        canonical = record.get("canonical")
        shown = _policy_text(canonical) if isinstance(canonical, dict) else ""
        out.append(
            f'<tr class="policy" data-hash="{html_text(record.get("policy", ""))}">'
            f"<td><code>{html_text(record.get('ts', '-'))}</code></td>"
            f"<td>{html_text('(top level)' if client is None else client)}</td>"
            f"<td>{html_text(record.get('source', '-'))}</td>"
            f"<td><code>{html_text(record.get('policy', '-'))}</code></td>"
            f"<td>{shown}</td></tr>"
        )
    out.append("</table>")
    if data.policies_more:
        out.append(f'<p class="more">... and {data.policies_more} more policy records</p>')
    return "\n".join(out)


def _policy_text(canonical: dict[object, object]) -> str:
    lines = []
    for key in ("default", "mode", "allow", "block", "framework_routes"):
        value = canonical.get(key)
        if isinstance(value, list):
            value = ", ".join(str(v) for v in value) or "-"
        shown = html_text(value if value is not None else "-")
        lines.append(f"{html_text(key)}: <code>{shown}</code>")
    return "<br>".join(lines)


def lifecycle_section(data: ReportData) -> str:
    out = ['<h2 id="lifecycle-title">Sandbox lifecycle (not requests)</h2>']
    if not data.lifecycle:
        return "\n".join([*out, "<p>(none)</p>"])
    out.append(
        '<table id="lifecycle"><tr><th>time</th><th>event</th><th>sandbox</th><th>detail</th></tr>'
    )
    for record in data.lifecycle:
        out.append(
            f'<tr class="lifecycle" data-event="{html_text(record.get("reason", ""))}">'
            f"<td><code>{html_text(record.get('ts', '-'))}</code></td>"
            f"<td>{html_text(record.get('reason', '-'))}</td>"
            f"<td><code>{html_text(record.get('host', '-'))}</code></td>"
            f"<td>{html_text(record.get('detail', ''))}</td></tr>"
        )
    out.append("</table>")
    if data.lifecycle_more:
        out.append(f'<p class="more">... and {data.lifecycle_more} more lifecycle records</p>')
    return "\n".join(out)


__all__ = [
    "blocked_hosts_section",
    "clients_section",
    "errors_section",
    "html_text",
    "kinds_section",
    "lifecycle_section",
    "policies_section",
    "reached_section",
    "refusals_section",
    "timelines_section",
]

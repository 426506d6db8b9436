"""`egress audit report --html`: one self-contained HTML page for a reviewer
(docs/audit-log.md#egress-audit-report).

Strategy: the page is built from what one streaming pass keeps, so memory is bounded by
distinct values, never by lines (as `summarize`): the `Summary` tables, the records by kind
(plain-HTTP requests, tunnels, DNS queries, no destination) and decision, per host reached
(allowed) its requests, tunnels, ports and bytes, per client its kinds, decisions, bytes and
the hosts it reached (`MAX_CLIENT_HOSTS` each), per blocked host its reasons and rules, per
error reason and destination its count and first detail (`MAX_ERRORS` of them), per client
(execution or sandbox) its decisions per minute, the policy records (up to
`MAX_POLICIES`), the lifecycle records (up to `MAX_LIFECYCLE`). The chain's
verify result is computed by the caller and shown first: a report of a doctored log is worth
nothing.

The page has no script, no font, no stylesheet or image from anywhere: inline CSS and inline
SVG only, so it opens offline and from an attachment. Everything from the log is untrusted
(an agent chooses hosts and paths): every field goes through `_text` (terminal-control and
bidi characters escaped as by `printable`, then HTML-escaped, quotes included).

No I/O of its own: records in, text out (their vocabulary, `Summary` and the record
kinds, is `read.py`'s, whose readers open files).
"""

from __future__ import annotations

import html
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final

from egress.audit.read import Summary, client_ip, is_lifecycle, is_request
from egress.printable import printable

MAX_POLICIES: Final = 1000  # policy records listed; the rest counted
MAX_LIFECYCLE: Final = 1000  # lifecycle records listed; the rest counted
MAX_TIMELINES: Final = 50  # clients with a timeline (busiest first); the rest counted
MAX_ROWS: Final = 200  # rows per table; the rest counted
COLUMNS: Final = 60  # bars per timeline
MAX_SLICES: Final = 200_000  # (client, time slice) counters kept before coarsening
MAX_ERRORS: Final = 10_000  # (reason, destination) error rows kept; the rest counted
MAX_CLIENT_HOSTS: Final = 1000  # hosts reached kept per client; the rest counted together
MAX_PORTS: Final = 16  # ports kept per host reached
MAX_DETAIL: Final = 300  # characters of an error's first detail shown
# what a record is, for the split of tunnels from requests (docs/audit-log.md#egress-audit-report)
KINDS: Final = ("request", "tunnel", "dns", "nowhere")
_KIND_TITLES: Final = {
    "request": "plain-HTTP requests",
    "tunnel": "tunnels (CONNECT, SOCKS5, transparent, forwarder)",
    "dns": "DNS queries (transparent mode)",
    "nowhere": "no destination (refused before a request, malformed target)",
}
_PAD: Final = {19: "", 16: ":00", 13: ":00:00", 10: "T00:00:00"}
_SLOT: Final = {"allow": 0, "block": 1, "error": 2}
# allow, block, error: errors are no refusal by the policy, so never in a block's red
_COLORS: Final = ("#2e7d32", "#c62828", "#ef6c00")


@dataclass
class Verified:
    """The chain's verify result, as `egress audit verify` prints it."""

    ok: bool
    verdict: str  # the last line: `OK: ...` or `FAILED: ...`
    problems: list[str] = field(default_factory=list)


def kind_of(record: dict[str, object]) -> str:
    """`request`, `tunnel`, `dns` or `nowhere` (a record that names no destination)."""
    method = record.get("method")
    if method == "DNS":
        return "dns"
    if method == "-" or not record.get("host"):
        return "nowhere"
    # SOCKS5 and transparent tunnels are CONNECT records (docs/audit-log.md)
    return "tunnel" if method in ("CONNECT", "FORWARD") else "request"


@dataclass
class Reached:
    """A host the policy let the agent reach: what went there."""

    kinds: list[int] = field(default_factory=lambda: [0, 0, 0])  # request, tunnel, dns
    ports: set[int] = field(default_factory=set)
    bytes_up: int = 0
    bytes_down: int = 0

    def add(self, record: dict[str, object], kind: str) -> None:
        self.kinds[KINDS.index(kind)] += 1
        port = record.get("port")
        if isinstance(port, int) and len(self.ports) < MAX_PORTS:
            self.ports.add(port)
        self.bytes_up += _count(record.get("bytes_up"))
        self.bytes_down += _count(record.get("bytes_down"))


@dataclass
class ClientRow:
    """One client (execution or sandbox): its records by kind and decision, its bytes and
    the hosts it reached."""

    kinds: list[int] = field(default_factory=lambda: [0, 0, 0, 0])  # as KINDS
    decisions: list[int] = field(default_factory=lambda: [0, 0, 0])  # allow, block, error
    bytes_up: int = 0
    bytes_down: int = 0
    hosts: dict[str, int] = field(default_factory=dict)  # host reached -> allowed records
    hosts_more: int = 0  # allowed records to hosts beyond MAX_CLIENT_HOSTS

    def add(self, record: dict[str, object], kind: str, slot: int | None) -> None:
        self.kinds[KINDS.index(kind)] += 1
        if slot is not None:
            self.decisions[slot] += 1
        self.bytes_up += _count(record.get("bytes_up"))
        self.bytes_down += _count(record.get("bytes_down"))
        if slot == 0 and kind != "nowhere":
            host = str(record.get("host"))
            if host in self.hosts or len(self.hosts) < MAX_CLIENT_HOSTS:
                self.hosts[host] = self.hosts.get(host, 0) + 1
            else:
                self.hosts_more += 1


@dataclass
class ErrorRow:
    """Errors of one reason to one destination: how many, and the first one's detail."""

    detail: str
    count: int = 0


def _count(value: object) -> int:
    return value if isinstance(value, int) and value > 0 else 0


@dataclass
class ReportData:
    """What the page shows, fed one record at a time (`add`)."""

    summary: Summary = field(default_factory=Summary)
    # blocked host -> {(reason, rule): count}
    blocked: dict[str, dict[tuple[str, str], int]] = field(default_factory=dict)
    # client -> time slice (a ts prefix: `2026-11-30T05:22:07`) -> [allow, block, error]
    timeline: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    resolution: int = 19  # the ts prefix kept: seconds, coarsened when slices are too many
    slices: int = 0
    policies: list[dict[str, object]] = field(default_factory=list)
    policies_more: int = 0
    lifecycle: list[dict[str, object]] = field(default_factory=list)
    lifecycle_more: int = 0
    kinds: dict[str, list[int]] = field(default_factory=lambda: {k: [0, 0, 0] for k in KINDS})
    reached: dict[str, Reached] = field(default_factory=dict)  # allowed host -> what went
    clients: dict[str, ClientRow] = field(default_factory=dict)
    errors: dict[tuple[str, str], ErrorRow] = field(default_factory=dict)  # (reason, where)
    errors_more: int = 0  # error records beyond MAX_ERRORS distinct rows

    def add(self, record: dict[str, object]) -> None:
        kind = record.get("type")
        if kind == "start":
            self.summary.runs += 1
        elif kind == "policy":
            if len(self.policies) < MAX_POLICIES:
                self.policies.append(record)
            else:
                self.policies_more += 1
        elif is_lifecycle(record):
            self.summary.add_lifecycle(record)
            if len(self.lifecycle) < MAX_LIFECYCLE:
                self.lifecycle.append(record)
            else:
                self.lifecycle_more += 1
        elif is_request(record):
            self._request(record)

    def _request(self, record: dict[str, object]) -> None:
        self.summary.add(record)
        decision = record.get("decision")
        slot = _SLOT.get(decision) if isinstance(decision, str) else None
        kind = kind_of(record)
        client = str(record.get("client_id") or client_ip(record.get("client", "(none)")))
        row = self.clients.get(client)
        if row is None:
            row = self.clients[client] = ClientRow()
        row.add(record, kind, slot)
        if slot is None:
            return
        self.kinds[kind][slot] += 1
        if slot == 0 and kind != "nowhere":
            host = str(record.get("host"))
            reached = self.reached.get(host)
            if reached is None:
                reached = self.reached[host] = Reached()
            reached.add(record, kind)
        elif slot == 2:
            self._error(record, kind)
        if slot == 1:
            host = str(record.get("host") or "(none)")
            rule = record.get("rule")
            key = (str(record.get("reason") or "(none)"), "" if rule is None else str(rule))
            per_host = self.blocked.setdefault(host, {})
            per_host[key] = per_host.get(key, 0) + 1
        ts = record.get("ts")
        if isinstance(ts, str) and len(ts) >= 19:
            client = str(record.get("client_id") or client_ip(record.get("client", "(none)")))
            slices = self.timeline.setdefault(client, {})
            moment = ts[: self.resolution]
            counts = slices.get(moment)
            if counts is None:
                counts = slices[moment] = [0, 0, 0]
                self.slices += 1
                if self.slices > MAX_SLICES:
                    self._coarsen()
                    self._request_slot(client, ts, slot)
                    return
            counts[slot] += 1

    def _error(self, record: dict[str, object], kind: str) -> None:
        where = "(no destination)" if kind == "nowhere" else str(record.get("host"))
        if kind != "nowhere" and isinstance(record.get("port"), int):
            where = f"{where}:{record['port']}"
        key = (str(record.get("reason") or "(none)"), where)
        row = self.errors.get(key)
        if row is None:
            if len(self.errors) >= MAX_ERRORS:
                self.errors_more += 1
                return
            row = self.errors[key] = ErrorRow(str(record.get("detail") or "")[:MAX_DETAIL])
        row.count += 1

    def _request_slot(self, client: str, ts: str, slot: int) -> None:
        slices = self.timeline[client]
        key = ts[: self.resolution]
        slices.setdefault(key, [0, 0, 0])[slot] += 1

    def _coarsen(self) -> None:
        """Seconds -> minutes -> hours -> days: memory stays bounded on long logs."""
        self.resolution = {19: 16, 16: 13}.get(self.resolution, 10)
        merged: dict[str, dict[str, list[int]]] = {}
        for client, slices in self.timeline.items():
            out = merged[client] = {}
            for key, counts in slices.items():
                total = out.setdefault(key[: self.resolution], [0, 0, 0])
                for i in range(3):
                    total[i] += counts[i]
        self.timeline = merged
        self.slices = sum(len(v) for v in merged.values())


def _text(value: object) -> str:
    """A log field as HTML text: one line, no terminal controls, every markup char escaped."""
    return html.escape(printable(str(value)), quote=True)


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
        "<p>Files: " + ", ".join(f"<code>{_text(f)}</code>" for f in files) + "</p>",
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
        f"<p>From <code>{_text(s.first_ts or '-')}</code> to "
        f"<code>{_text(s.last_ts or '-')}</code>"
        + (f"; {s.bad_lines} unreadable line(s)" if s.bad_lines else "")
        + "</p>",
        _kinds(data),
        _timelines(data),
        _clients(data),
        _reached(data),
        _blocked_hosts(data, domain_of),
        _errors(data),
        _refusals(s),
        _policies(data),
        _lifecycle(data),
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def _verify_section(v: Verified) -> str:
    cls = "ok" if v.ok else "failed"
    lines = [f'<div id="verify" class="{cls}" data-ok="{str(v.ok).lower()}">']
    lines.append(f"<strong>Hash chain: {'verified' if v.ok else 'FAILED'}</strong><br>")
    lines.append(f"<code>{_text(v.verdict)}</code>")
    if v.problems:
        lines.append("<ul>" + "".join(f"<li>{_text(p)}</li>" for p in v.problems) + "</ul>")
    lines.append("</div>")
    return "\n".join(lines)


def _timelines(data: ReportData) -> str:
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
        f"<p>{_text(start + pad)}Z to {_text(end + pad)}Z, {_duration(width)} per bar, "
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
            f'<tr class="timeline" data-client="{_text(client)}" '
            f'data-block="{totals[1]}" data-allow="{totals[0]}" data-error="{totals[2]}">'
            f"<td><code>{_text(client)}</code><br>{totals[1]} block, {totals[0]} allow, "
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


def _blocked_hosts(data: ReportData, domain_of: Callable[[str], str]) -> str:
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
            f"{n} {_text(reason)}" + (f" <code>{_text(rule)}</code>" if rule else "")
            for (reason, rule), n in sorted(hits.items(), key=lambda kv: (-kv[1], kv[0]))
        )
        out.append(
            f'<tr class="blocked-host" data-host="{_text(host)}" '
            f'data-blocks="{sum(hits.values())}"><td class="n">{sum(hits.values())}</td>'
            f"<td><code>{_text(host)}</code></td><td>{detail}</td></tr>"
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
            f'<tr class="blocked-domain" data-domain="{_text(domain)}" data-blocks="{n}">'
            f'<td class="n">{n}</td><td><code>{_text(domain)}</code></td></tr>'
        )
    out.append("</table>")
    if len(ranked) > MAX_ROWS:
        out.append(f'<p class="more">... and {len(ranked) - MAX_ROWS} more domains</p>')
    return "\n".join(out)


def _refusals(s: Summary) -> str:
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
            f'<tr class="refusal {word}" data-reason="{_text(reason)}" data-decision="{word}" '
            f'data-count="{n}"><td class="n">{n}</td><td>{word}</td>'
            f"<td><code>{_text(reason)}</code></td><td>{_bar(n, peak, word)}</td></tr>"
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


def _kinds(data: ReportData) -> str:
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


def _clients(data: ReportData) -> str:
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
        reached = ", ".join(f"<code>{_text(h)}</code> {n}" for h, n in top[:10])
        more = len(top) - 10
        if more > 0 or row.hosts_more:
            reached += f' <span class="more">and {max(more, 0)} more hosts'
            reached += f" (+{row.hosts_more} records)</span>" if row.hosts_more else "</span>"
        out.append(
            f'<tr class="client" data-client="{_text(client)}" data-requests="{row.kinds[0]}" '
            f'data-tunnels="{row.kinds[1]}" data-allow="{row.decisions[0]}" '
            f'data-block="{row.decisions[1]}" data-error="{row.decisions[2]}" '
            f'data-hosts="{len(row.hosts)}"><td><code>{_text(client)}</code></td>'
            + "".join(f'<td class="n">{n}</td>' for n in numbers)
            + f"<td>{reached or '-'}</td></tr>"
        )
    out.append("</table>")
    if len(rows) > MAX_ROWS:
        out.append(f'<p class="more">... and {len(rows) - MAX_ROWS} more clients</p>')
    return "\n".join(out)


def _reached(data: ReportData) -> str:
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
            f'<tr class="reached-host" data-host="{_text(host)}" '
            f'data-allows="{sum(seen.kinds)}" data-requests="{seen.kinds[0]}" '
            f'data-tunnels="{seen.kinds[1]}"><td><code>{_text(host)}</code></td>'
            + "".join(f'<td class="n">{n}</td>' for n in seen.kinds)
            + f'<td>{ports}</td><td class="n">{seen.bytes_up}</td>'
            f'<td class="n">{seen.bytes_down}</td></tr>'
        )
    out.append("</table>")
    if len(hosts) > MAX_ROWS:
        out.append(f'<p class="more">... and {len(hosts) - MAX_ROWS} more hosts</p>')
    return "\n".join(out)


def _errors(data: ReportData) -> str:
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
            f'<tr class="error-row" data-reason="{_text(reason)}" data-where="{_text(where)}" '
            f'data-count="{row.count}"><td class="n">{row.count}</td>'
            f"<td><code>{_text(reason)}</code></td><td><code>{_text(where)}</code></td>"
            f'<td class="detail">{_text(row.detail)}</td></tr>'
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


def _policies(data: ReportData) -> str:
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
            f'<tr class="policy" data-hash="{_text(record.get("policy", ""))}">'
            f"<td><code>{_text(record.get('ts', '-'))}</code></td>"
            f"<td>{_text('(top level)' if client is None else client)}</td>"
            f"<td>{_text(record.get('source', '-'))}</td>"
            f"<td><code>{_text(record.get('policy', '-'))}</code></td>"
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
        lines.append(f"{_text(key)}: <code>{_text(value if value is not None else '-')}</code>")
    return "<br>".join(lines)


def _lifecycle(data: ReportData) -> str:
    out = ['<h2 id="lifecycle-title">Sandbox lifecycle (not requests)</h2>']
    if not data.lifecycle:
        return "\n".join([*out, "<p>(none)</p>"])
    out.append(
        '<table id="lifecycle"><tr><th>time</th><th>event</th><th>sandbox</th><th>detail</th></tr>'
    )
    for record in data.lifecycle:
        out.append(
            f'<tr class="lifecycle" data-event="{_text(record.get("reason", ""))}">'
            f"<td><code>{_text(record.get('ts', '-'))}</code></td>"
            f"<td>{_text(record.get('reason', '-'))}</td>"
            f"<td><code>{_text(record.get('host', '-'))}</code></td>"
            f"<td>{_text(record.get('detail', ''))}</td></tr>"
        )
    out.append("</table>")
    if data.lifecycle_more:
        out.append(f'<p class="more">... and {data.lifecycle_more} more lifecycle records</p>')
    return "\n".join(out)


__all__ = ["ReportData", "Verified", "render_html"]

"""Results: medians with min/max, ratios to the peers and the direct path, plots, files."""

from __future__ import annotations

import datetime as dt
import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import anchors
from bench.measure import OUT
from bench.proxies import SUBJECT

DOCS = Path(__file__).resolve().parent.parent / "docs" / "bench"
Run = dict[str, Any]


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    higher_is_better: bool
    get: Callable[[Run], float | None]
    proxy_only: bool = False  # no value for the direct path (no proxy process)


def _dig(*path: str) -> Callable[[Run], float | None]:
    def get(run: Run) -> float | None:
        node: Any = run
        for key in path:
            if not isinstance(node, dict) or key not in node:
                return None
            node = node[key]
        return float(node) if isinstance(node, int | float) else None

    return get


def _cpu_s_per_gb(run: Run) -> float | None:
    bulk = run.get("bulk", {})
    cpu = sum(b.get("cpu_s", 0.0) for b in bulk.values())
    nbytes = sum(b.get("bytes", 0) for b in bulk.values())
    return cpu / (nbytes / 1e9) if nbytes and any("cpu_s" in b for b in bulk.values()) else None


METRICS = [
    *(
        Metric(f"http_c{c}_{k}", f"HTTP {lbl}, c{c}", hib, _dig("http", str(c), src))
        for c in (1, 16, 64)
        for k, lbl, hib, src in (
            ("rps", "req/s", True, "rps"),
            ("p50", "p50 ms", False, "p50_ms"),
            ("p99", "p99 ms", False, "p99_ms"),
        )
    ),
    Metric("tunnel_per_s", "CONNECT tunnels/s, c16", True, _dig("tunnels", "per_s")),
    Metric("tunnel_p99", "tunnel p99 ms, c16", False, _dig("tunnels", "p99_ms")),
    Metric("bulk_1", "bulk MB/s, 1 tunnel", True, _dig("bulk", "1", "mb_per_s")),
    Metric("bulk_8", "bulk MB/s, 8 tunnels", True, _dig("bulk", "8", "mb_per_s")),
    Metric(
        "cpu_req_c1",
        "CPU µs per request (c1)",
        False,
        _dig("http", "1", "cpu_us_per_request"),
        True,
    ),
    Metric(
        "cpu_req_c64",
        "CPU µs per request (c64)",
        False,
        _dig("http", "64", "cpu_us_per_request"),
        True,
    ),
    Metric(
        "kernel_req_c64",
        "kernel µs per request (c64)",
        False,
        _dig("http", "64", "kernel_us_per_request"),
        True,
    ),
    Metric("cpu_pct_c64", "CPU % of one core (c64)", False, _dig("http", "64", "cpu_pct"), True),
    Metric("cpu_tunnel", "CPU µs per tunnel", False, _dig("tunnels", "cpu_us_per_tunnel"), True),
    Metric(
        "kernel_tunnel",
        "kernel µs per tunnel",
        False,
        _dig("tunnels", "kernel_us_per_tunnel"),
        True,
    ),
    Metric("cpu_gb", "CPU s per GB tunneled", False, _cpu_s_per_gb, True),
    Metric("idle_rss", "idle RSS MB", False, _dig("idle_rss_mb"), True),
    Metric("peak_rss_c64", "peak RSS MB under c64", False, _dig("http", "64", "peak_rss_mb"), True),
    Metric("peak_rss", "peak RSS MB (whole run)", False, _dig("peak_rss_mb"), True),
]


def summarize(runs: list[Run]) -> dict[str, dict[str, dict[str, float]]]:
    """{target: {metric: {median, min, max, n}}} over the repetitions that produced a value."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for target in dict.fromkeys(r["target"] for r in runs):
        mine = [r for r in runs if r["target"] == target]
        stats: dict[str, dict[str, float]] = {}
        for m in METRICS:
            values = [v for v in (m.get(r) for r in mine) if v is not None]
            if values:
                stats[m.key] = {
                    "median": statistics.median(values),
                    "min": min(values),
                    "max": max(values),
                    "n": len(values),
                }
        out[target] = stats
    return out


def fmt(v: float | None) -> str:
    if v is None:
        return "–"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.3f}" if abs(v) < 1 else f"{v:.2f}"


def _cell(s: dict[str, float] | None) -> str:
    if not s:
        return "–"
    if s["n"] == 1 or s["min"] == s["max"]:
        return fmt(s["median"])
    return f"{fmt(s['median'])} ({fmt(s['min'])}–{fmt(s['max'])})"


def _ratio(a: dict[str, float] | None, b: dict[str, float] | None) -> str:
    if not a or not b or not b["median"]:
        return "–"
    return f"{a['median'] / b['median']:.2f}"


def _better(m: Metric) -> str:
    return "higher" if m.higher_is_better else "lower"


def numbers_table(result: dict[str, Any]) -> list[str]:
    summary = result["summary"]
    targets = [t for t in summary if summary[t]]
    lines = [
        "| metric | better | " + " | ".join(targets) + " |",
        "|---|---|" + "---|" * len(targets),
    ]
    for m in METRICS:
        cells = [_cell(summary[t].get(m.key)) for t in targets]
        lines.append(f"| {m.label} | {_better(m)} | " + " | ".join(cells) + " |")
    return lines


def ratio_table(result: dict[str, Any]) -> list[str]:
    """SUBJECT ÷ each other target (or, without SUBJECT, each peer ÷ direct)."""
    summary = result["summary"]
    present = [t for t in summary if summary[t]]
    if SUBJECT in present:
        pairs = [(SUBJECT, t) for t in present if t != SUBJECT]
    else:
        pairs = [(t, "direct") for t in present if t != "direct" and "direct" in present]
    if not pairs:
        return []
    lines = [
        "| metric | better | " + " | ".join(f"{a} ÷ {b}" for a, b in pairs) + " |",
        "|---|---|" + "---|" * len(pairs),
    ]
    for m in METRICS:
        cells = [_ratio(summary[a].get(m.key), summary[b].get(m.key)) for a, b in pairs]
        if any(c != "–" for c in cells):
            lines.append(f"| {m.label} | {_better(m)} | " + " | ".join(cells) + " |")
    return lines


def anchors_table(result: dict[str, Any]) -> list[str]:
    """SUBJECT's medians against the anchor bars (bench/anchors.py): met or not."""
    mine = result["summary"].get(SUBJECT)
    if not mine:
        return []
    lines = [
        f"| metric | {SUBJECT} | bar: any peer | per-request peer | Python peer "
        "| direct then / now |",
        "|---|---|---|---|---|---|",
    ]
    direct = result["summary"].get("direct", {})
    for m in METRICS:
        bars = anchors.BARS.get(m.key)
        s = mine.get(m.key)
        if bars is None or s is None:
            continue
        v = s["median"]

        def mark(bar: float, v: float = v, m: Metric = m) -> str:
            ok = v >= bar if m.higher_is_better else v <= bar
            return f"{fmt(bar)} {'✓' if ok else '✗'}"

        now = direct.get(m.key)
        then = fmt(bars[3]) if bars[3] is not None else "–"
        lines.append(
            f"| {m.label} | {fmt(v)} | {mark(bars[0])} | {mark(bars[1])} | {mark(bars[2])} | "
            f"{then} / {fmt(now['median']) if now else '–'} |"
        )
    return lines


def _flow_ratios(run: Run) -> list[tuple[str, float, bool]]:
    out = [(f"c{c}", r["origin_ratio"], r["ratio_ok"]) for c, r in run.get("http", {}).items()]
    if "tunnels" in run:
        out.append(("tunnels", run["tunnels"]["origin_ratio"], run["tunnels"]["ratio_ok"]))
    return out


def checks_table(result: dict[str, Any]) -> list[str]:
    lines = [
        "| target | version | forwarded (reps) | origin ÷ client count | "
        "2nd request on a kept-alive connection, other origin | audit log lines per rep "
        "(all traffic) | problems |",
        "|---|---|---|---|---|---|---|",
    ]
    by_target: dict[str, list[Run]] = {}
    for r in result["runs"]:
        by_target.setdefault(r["target"], []).append(r)
    for target, runs in by_target.items():
        version = next((r["version"] for r in runs if r.get("version")), "")
        fwd = [r["forward_check"]["ok"] for r in runs if "forward_check" in r]
        fwd_s = f"{sum(fwd)}/{len(runs)}" if fwd else "n/a"
        ratios = [x for r in runs for x in _flow_ratios(r)]
        ratio_s = "–"
        if ratios:
            lo, hi = min(x[1] for x in ratios), max(x[1] for x in ratios)
            bad = [f"{name} {v:.3f}" for name, v, ok in ratios if not ok]
            ratio_s = f"{lo:.4f}–{hi:.4f}" + (f" **off: {', '.join(bad)}**" if bad else "")
        routing = sorted({r["routing_check"]["result"] for r in runs if "routing_check" in r})
        problems = [r.get("skipped") or r.get("error") for r in runs]
        problems += [n for r in runs for n in r.get("notes", [])]
        problems += _error_counts(runs)
        audit = "; ".join(_audit_note(r) for r in runs if "audit_lines" in r) or "n/a"
        probs = "; ".join(sorted({p for p in problems if p})) or "none"
        lines.append(
            f"| {target} | {version} | {fwd_s} | {ratio_s} | "
            f"{', '.join(routing) or 'n/a'} | {audit} | {probs} |"
        )
    return lines


def _noise(runs: list[Run]) -> list[str]:
    out = []
    for r in runs:
        parts = [(f"c{c}", h) for c, h in r.get("http", {}).items()]
        parts += [("tunnels", r["tunnels"])] if "tunnels" in r else []
        parts += [(f"bulk x{s}", b) for s, b in r.get("bulk", {}).items()]
        for name, m in parts:
            if m.get("noisy"):
                load, proxy = m["load_core_other_pct"], m["proxy_core_other_pct"]
                where = f"load core {load}%" + (f", proxy core {proxy}%" if "cpu_s" in m else "")
                out.append(f"rep {r['rep'] + 1} {name}: other work took {where}")
    return out


def _audit_note(r: Run) -> str:
    # Warm-up, re-runs and bulk are logged too: a count, not a ratio to the measured runs.
    return f"{r['audit_lines']:,}"


def noise_summary(result: dict[str, Any]) -> str:
    """One line: how much of this run shared the machine with other work."""
    parts = [
        m
        for r in result["runs"]
        for m in [*r.get("http", {}).values(), r.get("tunnels"), *r.get("bulk", {}).values()]
        if m
    ]
    noisy = sum(1 for m in parts if m.get("noisy"))
    retried = sum(m.get("attempts", 1) - 1 for m in parts)
    waited = sum(r.get("quiet_wait_s", 0) for r in result["runs"])
    line = (
        f"Noise: {noisy} of {len(parts)} measurements kept with other work above 5% of a "
        f"core (flagged under Checks); {retried} re-runs; {waited:.0f} s spent waiting "
        "for a quiet machine."
    )
    steal = [m["proxy_core_steal_pct"] for m in parts if "proxy_core_steal_pct" in m]
    if steal:  # runs before this field was recorded have none
        line += (
            f" Hypervisor steal on the proxy's core: median {statistics.median(steal):.0f} %, "
            f"most {max(steal):.0f} % of a measurement (every target slowed alike: compare "
            "ratios, not absolute figures, with runs on other machines)."
        )
    return line


def _error_counts(runs: list[Run]) -> list[str]:
    """Noise flags, then client-side errors summed over the repetitions."""
    out = _noise(runs)
    http = [h for r in runs for h in r.get("http", {}).values()]
    sock = sum(h["socket_errors"] for h in http)
    status = sum(h["status_errors"] for h in http)
    if sock or status:
        total = sum(h["requests"] for h in http)
        out.append(
            f"HTTP: {sock:,} socket errors (wrk counts a proxy's close after a response), "
            f"{status:,} non-2xx, over {total:,} requests"
        )
    failed = sum(r["tunnels"]["errors"] for r in runs if "tunnels" in r)
    if failed:
        out.append(f"tunnels: {failed:,} failed")
    streams = sum(b.get("failed_streams", 0) for r in runs for b in r.get("bulk", {}).values())
    if streams:
        out.append(f"bulk: {streams} streams failed")
    return out


def extras_lines(extras: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    pol = extras.get("policy")
    if pol:
        lines += ["", "### Policy decision time", ""]
        if "skipped" in pol:
            lines.append(f"Skipped: {pol['skipped']}")
        else:
            lines += [
                "| rules | case | verdict | µs per verdict p50 | p99 | decide alone p50 |",
                "|---|---|---|---|---|---|",
            ]
            for row in pol["results"]:
                lines.append(
                    f"| {row['rules']} | {row['case']} | {row['verdict']} | "
                    f"{fmt(row['p50_us'])} | {fmt(row['p99_us'])} | "
                    f"{fmt(row.get('decide_p50_us'))} |"
                )
    nc = extras.get("netcut")
    if nc:
        lines += ["", "### netcut cut latency", ""]
        if "skipped" in nc:
            lines.append(f"Skipped: {nc['skipped']}")
        else:
            lines.append("`python bench/netcut_bench.py --json`: ")
            lines.append("")
            lines += ["| field | value |", "|---|---|"]
            lines += [
                f"| {k} | {json.dumps(v) if isinstance(v, dict | list) else v} |"
                for k, v in nc["result"].items()
            ]
    return lines


def markdown(result: dict[str, Any]) -> str:
    s = result["settings"]
    head = [
        f"## Bench run {result['started']} ({result['duration_s']:.0f} s)",
        "",
        f"{result['machine']['cpu']}, {result['machine']['cpus']} CPUs, "
        f"kernel {result['machine']['kernel']}, Python {result['machine']['python']}, "
        f"load average {result['machine'].get('loadavg_at_start', '?')} at start, "
        f"{result['machine'].get('loadavg_at_end', '?')} at end. "
        f"{s['reps']} repetitions, {s['seconds']:g} s per wrk/tunnel run, "
        f"{s['bulk_bytes'] / (1 << 20):,.0f} MiB per bulk run, log mode `{s['log_mode']}`, "
        f"{s['allow_rules']} allow rules. Cells: median (min–max) over the repetitions.",
        "",
    ]
    parts = [*head, noise_summary(result), "", *numbers_table(result), ""]
    ratios = ratio_table(result)
    if ratios:
        parts += ["### Ratios (medians of the same run)", "", *ratios, ""]
    bars = anchors_table(result)
    if bars:
        parts += [
            "### Against the anchor bars (measured earlier, elsewhere: indicative)",
            "",
            *bars,
            "",
        ]
    parts += ["### Checks", "", *checks_table(result)]
    parts += extras_lines(result.get("extras", {}))
    if result.get("curves"):
        from bench import curves

        parts += curves.markdown(result["curves"])
    return "\n".join(parts) + "\n"


def one_line(rec: Run) -> str:
    if "skipped" in rec:
        return f"{rec['target']}: skipped: {rec['skipped']}"
    if "error" in rec and "http" not in rec:
        return f"{rec['target']}: error: {rec['error']}"
    parts = [f"{rec['target']}"]
    for c, h in rec.get("http", {}).items():
        parts.append(f"c{c} {h['rps']:,.0f} req/s")
    if "tunnels" in rec:
        parts.append(f"tunnels {rec['tunnels']['per_s']:,.0f}/s")
    for s, b in rec.get("bulk", {}).items():
        parts.append(f"bulk x{s} {b['mb_per_s']:,.0f} MB/s")
    if "error" in rec:
        parts.append(f"error: {rec['error']}")
    return ", ".join(parts) + f" ({rec.get('wall_s', 0)} s)"


def write_all(result: dict[str, Any], started: dt.datetime, docs: bool) -> list[Path]:
    """bench/out/results-<timestamp>.{json,md} + plots; with docs, also docs/bench/."""
    from bench import plots  # matplotlib is imported only when there is something to plot

    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    OUT.mkdir(exist_ok=True)
    text = json.dumps(result, indent=1, sort_keys=False) + "\n"
    md = markdown(result)
    paths = [OUT / f"results-{stamp}.json", OUT / f"results-{stamp}.md"]
    paths[0].write_text(text)
    paths[1].write_text(md)
    plot_dir = OUT / f"plots-{stamp}"
    plot_dir.mkdir(exist_ok=True)
    paths += plots.write(result["summary"], plot_dir)
    if result.get("curves"):
        paths += plots.curves(result["curves"], plot_dir)
    if docs:
        DOCS.mkdir(parents=True, exist_ok=True)
        (DOCS / "results.json").write_text(text)
        (DOCS / "results.md").write_text(md)
        paths += [DOCS / "results.json", DOCS / "results.md", *plots.write(result["summary"], DOCS)]
        if result.get("curves"):
            paths += plots.curves(result["curves"], DOCS)
        if embed_in_page(md):
            paths.append(PAGE)
    return paths


PAGE = DOCS.parent / "benchmarks.md"
BEGIN, END = "<!-- bench:results:begin -->", "<!-- bench:results:end -->"


def embed_in_page(md: str) -> bool:
    """Replace the results section of docs/benchmarks.md (between the markers)."""
    try:
        page = PAGE.read_text()
    except OSError:
        return False
    if BEGIN not in page or END not in page:
        return False
    head, rest = page.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    body = md.replace("## Bench run", "### Bench run", 1).replace("\n### ", "\n#### ")
    PAGE.write_text(f"{head}{BEGIN}\n{body}{END}{tail}")
    return True

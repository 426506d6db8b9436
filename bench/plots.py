"""PNG plots of a run (matplotlib, Agg backend): medians with min/max whiskers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: chosen before pyplot is imported
import matplotlib.pyplot as plt

CONCURRENCY = (1, 16, 64)
Summary = dict[str, dict[str, dict[str, float]]]


def _med_err(stats: list[dict[str, float] | None]) -> tuple[list[float], list[list[float]]]:
    med = [s["median"] if s else float("nan") for s in stats]
    err = [
        [s["median"] - s["min"] if s else 0.0 for s in stats],
        [s["max"] - s["median"] if s else 0.0 for s in stats],
    ]
    return med, err


def _by_concurrency(ax: Any, summary: Summary, key: str) -> None:
    """One line per target: summary[target][key.format(c=...)] over CONCURRENCY."""
    for target, stats in summary.items():
        med, err = _med_err([stats.get(key.format(c=c)) for c in CONCURRENCY])
        ax.errorbar(CONCURRENCY, med, yerr=err, marker="o", capsize=3, label=target)
    ax.set(xscale="log", yscale="log")
    ax.set_xticks(CONCURRENCY, [str(c) for c in CONCURRENCY])
    ax.grid(alpha=0.3, which="both")


def throughput(summary: Summary, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    _by_concurrency(ax, summary, "http_c{c}_rps")
    ax.set(xlabel="concurrent keep-alive connections", ylabel="requests/s (log scale)")
    ax.set_title("Absolute-form HTTP throughput (median, min/max)")
    ax.legend()
    return _save(fig, path)


def latency(summary: Summary, path: Path) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    for ax, pct in zip(axes, ("p50", "p99"), strict=True):
        _by_concurrency(ax, summary, "http_c{c}_" + pct)
        ax.set(xlabel="concurrent connections", title=pct)
    axes[0].set_ylabel("latency, ms")
    axes[1].legend()
    fig.suptitle("Absolute-form HTTP latency (median, min/max)")
    return _save(fig, path)


def tunnels_bulk(summary: Summary, path: Path) -> Path:
    targets = list(summary)
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.5))
    panels = (
        ("tunnel_per_s", "CONNECT tunnels/s, c16"),
        ("bulk_1", "bulk MB/s, 1 tunnel"),
        ("bulk_8", "bulk MB/s, 8 tunnels"),
    )
    for ax, (key, title) in zip(axes, panels, strict=True):
        med, err = _med_err([summary[t].get(key) for t in targets])
        colors = [f"C{i}" for i in range(len(targets))]
        ax.bar(targets, [0.0 if m != m else m for m in med], yerr=err, capsize=3, color=colors)
        ax.set_title(title)
        ax.tick_params(axis="x", rotation=30)
        ax.grid(alpha=0.3, axis="y")
    return _save(fig, path)


def write(summary: Summary, outdir: Path) -> list[Path]:
    """throughput.png, latency.png and tunnels_bulk.png for the targets that have figures."""
    present = {t: s for t, s in summary.items() if s}
    return [
        throughput(present, outdir / "throughput.png"),
        latency(present, outdir / "latency.png"),
        tunnels_bulk(present, outdir / "tunnels_bulk.png"),
    ]


def curves(data: dict[str, Any], outdir: Path) -> list[Path]:
    """curves.png (rules, idle connections, tunnel concurrency) and looplag.png."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    rules = [r for r in data.get("rules") or [] if isinstance(r, dict) and "rps" in r]
    if rules:
        ax = axes[0]
        xs = [r["rules"] for r in rules]
        ax.plot(xs, [r["rps"] for r in rules], marker="o", color="C0", label="req/s")
        ax.set(xscale="log", xlabel="policy rules", ylabel="req/s (c64)", ylim=(0, None))
        twin = ax.twinx()
        cpu = [r["cpu_us_per_request"] or float("nan") for r in rules]
        twin.plot(xs, cpu, marker="s", color="C3", label="CPU µs/request")
        twin.set(ylabel="CPU µs per request", ylim=(0, None))
        ax.set_title("HTTP c64 by policy size (egress)")
        ax.legend(loc="lower left")
        twin.legend(loc="lower right")
        ax.grid(alpha=0.3)
    series = (data.get("idle") or {}).get("series", {})
    if series:
        ax = axes[1]
        for state, rows in series.items():
            idle = [r for r in rows if "rss_mb" in r]
            ax.plot(
                [r["connections"] for r in idle],
                [r["rss_mb"] for r in idle],
                marker="o",
                label=state,
            )
            for r in idle:
                if r.get("kb_per_connection"):
                    ax.annotate(
                        f"{r['kb_per_connection']:.1f} KB",
                        (r["connections"], r["rss_mb"]),
                        textcoords="offset points",
                        xytext=(-20, 6),
                        fontsize=7,
                    )
        ax.set(xlabel="open idle client connections", ylabel="RSS MB", ylim=(0, None))
        ax.set_title("Memory by idle connections (egress)")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    tun = [r for r in data.get("tunnels") or [] if "per_s" in r]
    if tun:
        ax = axes[2]
        twin = ax.twinx()
        for i, name in enumerate(dict.fromkeys(r["target"] for r in tun)):
            mine = [r for r in tun if r["target"] == name]
            xs = [r["concurrency"] for r in mine]
            ax.plot(
                xs, [r["per_s"] for r in mine], marker="o", color=f"C{i}", label=f"{name} tunnels/s"
            )
            twin.plot(
                xs,
                [r["p99_ms"] for r in mine],
                marker="x",
                ls="--",
                color=f"C{i}",
                label=f"{name} p99",
            )
        ax.set(xscale="log", xlabel="concurrent clients", ylabel="tunnels/s", ylim=(0, None))
        ax.set_xticks([1, 16, 64, 256], ["1", "16", "64", "256"])
        twin.set(ylabel="p99 ms (dashed)", yscale="log")
        ax.set_title("CONNECT tunnels by concurrency")
        ax.legend(loc="upper left", fontsize=8)
        ax.grid(alpha=0.3)
    paths = [_save(fig, outdir / "curves.png")]
    lag = (data.get("loop_lag") or {}).get("modes")
    if lag:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        bars = [(mode, load, r) for mode, row in lag.items() for load, r in row.items()]
        labels = [f"{mode}\n{load}" for mode, load, _ in bars]
        ax.bar(
            labels,
            [r["p99_ms"] for _, _, r in bars],
            color=[f"C{i}" for i, (mode, _, _) in enumerate(bars)],
            label="p99",
        )
        ax.plot(labels, [r["p50_ms"] for _, _, r in bars], "k_", markersize=20, label="p50")
        ax.axhline(5.0, color="red", ls=":", label="goal: p99 ≤ 5 ms")
        ax.set(ylabel="host tick lateness, ms", title="Host event-loop lag (1 ms tick)")
        ax.tick_params(axis="x", labelsize=7)
        ax.legend()
        paths.append(_save(fig, outdir / "looplag.png"))
    return paths


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

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


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

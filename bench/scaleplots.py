"""PNG plots of a `bench.scale` run (matplotlib, Agg backend), for docs/benchmarks.md."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: chosen before pyplot is imported
import matplotlib.pyplot as plt


def _by_n(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """The median of `key` per N over the repetitions."""
    ns = sorted({r["n"] for r in rows})
    values = []
    for n in ns:
        got = sorted(r[key] for r in rows if r["n"] == n and r.get(key) is not None)
        values.append(got[len(got) // 2] if got else float("nan"))
    return ns, values


def prepare_release(result: dict[str, Any], path: Path) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    rows = result["runs"]
    for key, label in (
        ("prepare_batch_ms", "prepare: whole batch"),
        ("prepare_ms_p99", "prepare p99"),
        ("release_ms_p99", "release p99"),
    ):
        axes[0].plot(*_by_n(rows, key), marker="o", label=label)
    axes[0].axhline(600, ls="--", c="grey", lw=0.8)
    axes[0].axhline(250, ls=":", c="grey", lw=0.8)
    axes[0].set(xlabel="sandboxes prepared at once", ylabel="ms", title="Time (targets dashed)")
    axes[0].legend()
    for key, label in (("prepare_cpu_ms", "prepare"), ("release_cpu_ms", "release")):
        axes[1].plot(*_by_n(rows, key), marker="o", label=label)
    axes[1].axhline(5, ls="--", c="grey", lw=0.8)
    axes[1].set(xlabel="sandboxes at once", ylabel="CPU ms per call", title="CPU per call")
    axes[1].legend()
    for ax in axes:
        ax.grid(alpha=0.3)
    return _save(fig, path)


def datapath(result: dict[str, Any], path: Path) -> Path:
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    for phase, style in (("paced", "-"), ("closed", "--")):
        rows = [{"n": d["n"], **d[phase]} for d in result["datapath"]]
        axes[0].plot(*_by_n(rows, "ms_p99"), style, marker="o", label=f"{phase} p99")
        axes[0].plot(*_by_n(rows, "ms_p50"), style, marker=".", label=f"{phase} p50")
        axes[1].plot(*_by_n(rows, "lag_ms_p99"), style, marker="o", label=f"{phase} p99")
        axes[2].plot(*_by_n(rows, "gc_max_ms"), style, marker="o", label=f"{phase} wall")
        if all("gc_max_cpu_ms" in r for r in rows):
            axes[2].plot(*_by_n(rows, "gc_max_cpu_ms"), style, marker="x", label=f"{phase} CPU")
    axes[0].axhline(10, ls="--", c="grey", lw=0.8)
    axes[1].axhline(5, ls="--", c="grey", lw=0.8)
    axes[2].axhline(10, ls="--", c="grey", lw=0.8)
    axes[0].set(xlabel="sandboxes", ylabel="ms (symlog)", title="Request latency", yscale="symlog")
    axes[1].set(xlabel="sandboxes", ylabel="ms (symlog)", title="Event-loop lag", yscale="symlog")
    axes[2].set(xlabel="sandboxes", ylabel="ms", title="Longest GC pause")
    axes[0].set_ylim(bottom=0)
    axes[1].set_ylim(bottom=0)
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    return _save(fig, path)


def churn(result: dict[str, Any], path: Path) -> Path:
    samples = result["churn"]["rss"]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    cycles = [s["cycle"] for s in samples]
    ax.plot(cycles, [s["proxy_rss_kib"] / 1024 for s in samples], marker=".", label="proxy")
    ax.plot(cycles, [s["workers_rss_kib"] / 1024 for s in samples], marker=".", label="workers")
    ax.set(xlabel="churn cycle", ylabel="RSS, MiB", title="RSS over churn")
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, path)


def write(result: dict[str, Any], directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    made = [prepare_release(result, directory / "scale-prepare.png")]
    if result.get("datapath"):
        made.append(datapath(result, directory / "scale-datapath.png"))
    if result.get("churn"):
        made.append(churn(result, directory / "scale-churn.png"))
    return made


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path

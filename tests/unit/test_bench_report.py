"""The bench report states what the machine did to a run: other work and hypervisor steal."""

from __future__ import annotations

from typing import Any

from bench import procfs
from bench.report import noise_summary


def _run(steal: float | None) -> dict[str, Any]:
    m: dict[str, Any] = {"noisy": False, "attempts": 1}
    if steal is not None:
        m["proxy_core_steal_pct"] = steal
    return {"http": {"c64": dict(m)}, "tunnels": dict(m), "bulk": {}, "quiet_wait_s": 0}


def test_a_run_on_a_stolen_core_says_so() -> None:
    line = noise_summary({"runs": [_run(25.0), _run(5.0), _run(30.0)]})
    assert "Hypervisor steal on the proxy's core: median 25 %, most 30 %" in line


def test_a_run_recorded_before_steal_was_measured_reads_as_before() -> None:
    line = noise_summary({"runs": [_run(None)]})
    assert "steal" not in line
    assert line.startswith("Noise: 0 of 2 measurements")


def test_steal_is_read_from_proc_stat() -> None:
    with open("/proc/stat") as f:
        fields = next(line for line in f if line.startswith("cpu0 ")).split()
    assert procfs.cpu_steal_seconds(0) >= int(fields[8]) / procfs.CLK_TCK

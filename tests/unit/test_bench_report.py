"""The bench report states what the machine did to a run (other work, hypervisor steal) and
which part of a proxy's CPU was the kernel's."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from bench import procfs
from bench.cli import Cost
from bench.report import METRICS, noise_summary, summarize


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


# -- the kernel's part of the proxy's CPU (docs/benchmarks.md#kernel-time) ------------------

_WORK = {
    # a megabyte copied by the kernel per call: system time, little of the interpreter's
    # (4,000 of them, ~0.2 s: far more than the 10 ms ticks that utime and stime count in)
    "kernel": "fd = os.open('/dev/zero', os.O_RDONLY)\nfor _ in range(4000): os.read(fd, 1 << 20)",
    "user": "sum(i * i for i in range(3_000_000))",
}


def _costed(work: str) -> dict[str, Any]:
    """A child process's cost over `work`, as the bench records a measurement's: started,
    then measured from its "go" to its "done" (lines on its pipes, no sleeps)."""
    code = f"import os, sys\nsys.stdin.readline()\n{work}\nprint('done', flush=True)\n"
    code += "sys.stdin.readline()\n"
    with subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as child:
        assert child.stdin is not None
        assert child.stdout is not None
        with Cost(child.pid) as cost:
            child.stdin.write("go\n")
            child.stdin.flush()
            assert child.stdout.readline() == "done\n"
        child.stdin.write("end\n")
        child.stdin.flush()
    r: dict[str, Any] = {}
    cost.record(r, 1000, "cpu_us_per_tunnel")
    return r


def test_a_measurement_records_the_kernels_part_of_the_cpu() -> None:
    kernel, user = _costed(_WORK["kernel"]), _costed(_WORK["user"])
    for r in (kernel, user):
        assert 0 <= r["kernel_s"] <= r["cpu_s"]
        assert r["kernel_us_per_tunnel"] == r["kernel_s"] / 1000 * 1e6
    assert kernel["kernel_s"] > 0.5 * kernel["cpu_s"]  # copying in the kernel
    assert user["kernel_s"] < 0.5 * user["cpu_s"]  # the interpreter's own loop


def test_the_report_shows_the_kernels_part_beside_the_cpu() -> None:
    def run(target: str, cpu: float, kernel: float) -> dict[str, Any]:
        m = {"cpu_us_per_request": cpu, "kernel_us_per_request": kernel}
        t = {"cpu_us_per_tunnel": 2 * cpu, "kernel_us_per_tunnel": 2 * kernel}
        return {"target": target, "http": {"64": m}, "tunnels": t}

    stats = summarize([run("egress", 200.0, 40.0), run("squid", 150.0, 38.0)])
    assert stats["egress"]["kernel_req_c64"]["median"] == 40.0
    assert stats["squid"]["kernel_tunnel"]["median"] == 76.0
    labels = [m.label for m in METRICS]
    assert (
        labels.index("kernel µs per request (c64)") == labels.index("CPU µs per request (c64)") + 1
    )
    assert labels.index("kernel µs per tunnel") == labels.index("CPU µs per tunnel") + 1

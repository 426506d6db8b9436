"""Durations under uvloop (issue: whole milliseconds): records, stderr lines and metrics
come from `time.perf_counter_ns`, not from the event loop's clock (docs/audit-log.md).

The origin listens on a loopback port of this namespace, reached as a framework route (the
one way `egress serve` lets the guard through to loopback), so no root is needed: what is
timed is the same accept, decision, connect and relay."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path

import pytest

from servers import run, start_origin


async def _serve(*args: str) -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "egress.cli",
        "serve",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode().strip()
    assert line.startswith("listening on "), line
    return proc, line.removeprefix("listening on ")


def _admin_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("audit", [True, False], ids=["records", "stderr"])
async def test_uvloop_durations_are_not_whole_milliseconds(tmp_path: Path, audit: bool) -> None:
    pytest.importorskip("uvloop")
    origin = await start_origin(None, 0)
    url = f"http://{origin.authority}/"
    log = tmp_path / "audit.jsonl"
    admin = _admin_port()
    extra = ["--audit-log", str(log)] if audit else []
    proc, proxy = await _serve(
        "--listen",
        "127.0.0.1:0",
        "--framework-route",
        url,
        "--admin",
        f"127.0.0.1:{admin}",
        *extra,
    )
    try:
        for _ in range(6):
            rc, _, err = await run("curl", "-sS", "--max-time", "5", "-x", f"http://{proxy}", url)
            assert rc == 0, err
        rc, metrics, err = await run("curl", "-sS", f"http://127.0.0.1:{admin}/metrics")
        assert rc == 0, err
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(proc.communicate(), 20)
        await origin.close()
    sums = {
        line.split()[0]: float(line.split()[1])
        for line in metrics.splitlines()
        if line.startswith(("egress_connect_seconds_sum", "egress_decision_seconds_sum"))
    }
    # six connects: more than nothing, whatever the loop's clock says
    assert sums["egress_connect_seconds_sum"] > 0.0, metrics
    assert sums["egress_decision_seconds_sum"] > 0.0, metrics
    if audit:
        records = [json.loads(x) for x in log.read_text().splitlines()]
        durations = [r["duration_ms"] for r in records if "duration_ms" in r]
    else:
        lines = [x for x in stderr.decode().splitlines() if x.startswith("egress: allow GET")]
        durations = [float(x.split()[-1].removesuffix("ms")) for x in lines]
    assert len(durations) == 6, (durations, stderr.decode())
    # a whole-millisecond clock gives 0.0 or 1.0 every time; microseconds almost never
    assert any(d != int(d) for d in durations), durations

"""Descriptor exhaustion becomes recorded 503s (issue 20, item 5; docs/proxy.md#file-descriptors).

`egress serve` under `prlimit --nofile=256`, 300 clients holding their connections, on uvloop
and on the stock loop. Before: uvloop accepted and closed 82 connections with no record and
no log line; the stock loop printed a traceback per failed `accept` (410 MB of stderr in
40 s) while new connections hung. Now the start-up budget lowers `max_connections` to what
the descriptors allow (and says so), every client gets an answer, every answer a record.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path

import pytest

CLIENTS = 300
SOURCES = 15  # 20 clients per source address: the global cap is what refuses them
REQUEST = b"GET http://denied.test/ HTTP/1.1\r\nHost: denied.test\r\n\r\n"


async def start_serve(*args: str) -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        "prlimit", "--nofile=256", "--", sys.executable, "-m", "egress.cli", "serve", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode().strip()
    assert line.startswith("listening on "), line
    return proc, line.removeprefix("listening on ")


class Gate:
    """Every client keeps its slot until all of them have their answer."""

    def __init__(self, n: int) -> None:
        self.left = n
        self.all_answered = asyncio.Event()

    def answered(self) -> None:
        self.left -= 1
        if self.left == 0:
            self.all_answered.set()


async def client(host: str, port: int, source: str, gate: Gate) -> int | None:
    """One client: its status (None: closed or reset without an answer, or no answer)."""
    status = None
    writer = None
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, local_addr=(source, 0)), 20
        )
        writer.write(REQUEST)
        line = await asyncio.wait_for(reader.readline(), 20)
        status = int(line.split()[1]) if line.startswith(b"HTTP/1.1 ") else None
    except (OSError, TimeoutError, ValueError, IndexError):
        pass
    gate.answered()
    await gate.all_answered.wait()
    if writer is not None:
        writer.close()
    return status


@pytest.mark.timeout(180)
@pytest.mark.parametrize("loop", ["uvloop", "stock"])
async def test_descriptor_exhaustion_is_answered_and_recorded(loop: str, tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    extra = ["--no-uvloop"] if loop == "stock" else []
    proc, address = await start_serve("--listen", "127.0.0.1:0", "--audit-log", str(log),
                                      "--quiet", *extra)  # fmt: skip
    host, port = address.rsplit(":", 1)
    gate = Gate(CLIENTS)
    try:
        statuses = await asyncio.gather(
            *(client(host, int(port), f"127.0.1.{1 + i % SOURCES}", gate) for i in range(CLIENTS))
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    stderr = err.decode(errors="replace")
    assert None not in statuses, f"{statuses.count(None)} clients got no answer"
    assert len(err) < 20_000, stderr[:2000]
    assert "Traceback" not in stderr
    assert "too low for max_connections" in stderr  # the budget said what it did
    assert set(statuses) <= {403, 503}
    assert 503 in statuses
    records = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]
    refused = sum(int(str(r.get("count", 1))) for r in records if r.get("status") == 503)
    served = [r for r in records if r.get("host") == "denied.test"]
    assert refused == statuses.count(503)
    assert len(served) == statuses.count(403)

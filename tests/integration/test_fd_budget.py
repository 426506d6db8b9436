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
# each source a sandbox of its own (loopback sources are otherwise one default client,
# docs/proxy.md#connection-slots, whose cap would refuse them before the global cap)
SANDBOXES = "".join(
    f'[clients.sb{n}]\nsources = ["127.0.1.{n}/32"]\n' for n in range(1, SOURCES + 1)
)
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
    policy = tmp_path / "policy.toml"
    policy.write_text(SANDBOXES)
    extra = ["--no-uvloop"] if loop == "stock" else []
    proc, address = await start_serve("--listen", "127.0.0.1:0", "--audit-log", str(log),
                                      "--policy", str(policy), "--quiet", *extra)  # fmt: skip
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
    assert not any("per-client" in str(r.get("detail")) for r in records)  # the global cap
    served = [r for r in records if r.get("host") == "denied.test"]
    assert refused == statuses.count(503)
    assert len(served) == statuses.count(403)


async def test_idle_admin_connections_cannot_starve_the_proxy(tmp_path: Path) -> None:
    """Under a 300-descriptor limit, 250 idle connections to the admin endpoint made proxy
    requests fail, unrecorded. Now the admin endpoint takes at most its own few (503 beyond),
    counted in the descriptor budget, and the proxy keeps answering and recording."""
    log = tmp_path / "audit.jsonl"
    policy = tmp_path / "policy.toml"  # four sandboxes, each under its own client cap
    policy.write_text(
        "".join(f'[clients.adm{n}]\nsources = ["127.0.2.{n}/32"]\n' for n in range(1, 5))
    )
    proc = await asyncio.create_subprocess_exec(
        "prlimit", "--nofile=300", "--", sys.executable, "-m", "egress.cli", "serve",
        "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--audit-log", str(log),
        "--policy", str(policy),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    assert proc.stderr is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode().strip()
    host, port = line.removeprefix("listening on ").rsplit(":", 1)
    admin = ""
    while "admin on " not in admin:
        admin = (await asyncio.wait_for(proc.stderr.readline(), 30)).decode()
    ahost, aport = admin.split("admin on http://", 1)[1].split("/", 1)[0].rsplit(":", 1)
    idle = []
    busy = 0
    reply = b""
    try:
        for _ in range(250):
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(ahost, int(aport)), 10
                )
            except (OSError, TimeoutError):
                continue
            idle.append(writer)
        # past its limit the admin endpoint answers 503 and closes at once
        reader, writer = await asyncio.open_connection(ahost, int(aport))
        reply = await asyncio.wait_for(reader.read(-1), 10)
        writer.close()
        busy = int(reply.startswith(b"HTTP/1.1 503"))
        gate = Gate(40)  # within the cap the budget leaves: every one is served
        statuses = await asyncio.gather(
            *(client(host, int(port), f"127.0.2.{1 + i % 4}", gate) for i in range(40))
        )
    finally:
        for writer in idle:
            writer.close()
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert b"Traceback" not in err, err.decode()[-2000:]
    assert busy == 1, (len(idle), reply[:200])
    assert statuses == [403] * 40
    records = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]
    assert len([r for r in records if r.get("host") == "denied.test"]) == 40


async def test_admin_connections_are_bounded_and_timed_out() -> None:
    """The admin endpoint's own limits, with small numbers: at most N connections (503
    beyond), each closed `lifetime` seconds after it was accepted."""
    from egress.proxy.telemetry.admin import AdminServer
    from egress.proxy.telemetry.metrics import ProxyMetrics

    server = AdminServer(ProxyMetrics(lambda: 0), lambda: (True, "ready"))
    host, port = await server.start("127.0.0.1", 0, max_connections=3, lifetime=0.5)
    try:
        held = [await asyncio.open_connection(host, port) for _ in range(3)]
        reader, writer = await asyncio.open_connection(host, port)
        assert (await asyncio.wait_for(reader.read(-1), 5)).startswith(b"HTTP/1.1 503 ")
        assert server.open == 3
        writer.close()
        for reader, writer in held:  # silent ones are closed at their lifetime's end
            assert await asyncio.wait_for(reader.read(-1), 5) == b""
            writer.close()
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert (await asyncio.wait_for(reader.read(-1), 5)).startswith(b"HTTP/1.1 200 ")
        writer.close()
    finally:
        await server.stop()


async def test_admin_on_a_public_address_must_be_asked_for() -> None:
    from egress import EgressProxy, Policy

    with pytest.raises(ValueError, match="admin_public=True"):
        EgressProxy(Policy(), admin="0.0.0.0:0")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "egress.cli", "serve", "--listen", "127.0.0.1:0",
        "--admin", "0.0.0.0:0", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2
    assert "--admin-public" in err.decode()
    async with EgressProxy(Policy(), admin="0.0.0.0:0", admin_public=True) as proxy:
        assert proxy.admin_url is not None

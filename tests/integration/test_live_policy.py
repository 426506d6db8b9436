"""Live policy: SIGHUP reload under load, and per-client replacement from the API
(docs/policy.md#live-policy-changes)."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from pathlib import Path

import pytest

from egress import EgressProxy, Policy, update_execution
from egress.boundary import Execution
from egress.config import ClientSpec, build_settings

import harness
from proxykit import MemoryAudit, exempt, read_response
from servers import run, start_origin

REQUEST = b"GET http://www.test/ HTTP/1.1\r\nHost: www.test\r\n\r\n"


async def hammer(host: str, port: int, stop: asyncio.Event, seen: list[tuple[float, int]]) -> None:
    """Requests one after another on a keep-alive connection until `stop`; a new connection
    when the proxy closed it (a policy change that forbids its last host closes it, or cuts
    the request in flight: docs/policy.md#live-policy-changes)."""
    while not stop.is_set():
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while not stop.is_set():
                sent = time.monotonic()
                writer.write(REQUEST)
                status, _, _ = await asyncio.wait_for(read_response(reader), 10)
                seen.append((sent, status))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def wait_line(stream: asyncio.StreamReader, needle: str) -> str:
    while True:
        line = (await asyncio.wait_for(stream.readline(), 20)).decode()
        assert line, f"stderr closed before {needle!r}"
        if needle in line:
            return line


@pytest.mark.userns
async def test_sighup_under_load_loses_nothing_and_applies_from_the_next_request(
    test_host: harness.TestHost, tmp_path: Path
) -> None:
    origin = await start_origin(test_host, 80)
    policy = tmp_path / "policy.toml"
    policy.write_text('allow = ["www.test"]\n')
    log = tmp_path / "audit.jsonl"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "egress.cli",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--policy",
        str(policy),
        "--resolve",
        f"www.test={test_host.addr_ns}",
        "--audit-log",
        str(log),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    seen: list[list[tuple[float, int]]] = [[] for _ in range(4)]
    stop = asyncio.Event()
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode().strip()
        host, port = line.removeprefix("listening on ").rsplit(":", 1)
        load = [asyncio.create_task(hammer(host, int(port), stop, s)) for s in seen]
        async with asyncio.timeout(20):
            while min(len(s) for s in seen) < 10:
                await asyncio.sleep(0.01)
        # a broken file: the old policy stays
        policy.write_text('allow = ["www.test"\n')
        proc.send_signal(signal.SIGHUP)
        failed = await wait_line(proc.stderr, "policy reload")
        assert "policy reload failed, keeping policy sha256:" in failed
        after_failed = time.monotonic()
        # the real change, under load
        policy.write_text('allow = []\nblock = ["www.test"]\n')
        proc.send_signal(signal.SIGHUP)
        reloaded = await wait_line(proc.stderr, "policy reload")
        confirmed = time.monotonic()
        assert "policy reloaded: sha256:" in reloaded
        async with asyncio.timeout(20):
            while min(sum(1 for t, _ in s if t > confirmed) for s in seen) < 5:
                await asyncio.sleep(0.01)
        stop.set()
        await asyncio.gather(*load)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 15) == 0
    finally:
        stop.set()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await origin.close()
    for s in seen:
        statuses = [status for _, status in s]
        assert set(statuses) <= {200, 403}
        # one switch, never back: 200s, then 403s
        assert statuses == sorted(statuses)
        assert all(status == 403 for sent, status in s if sent > confirmed)
        assert all(status == 200 for sent, status in s if sent < after_failed)
    records = [json.loads(x) for x in log.read_text().splitlines()]
    requests = [r for r in records if r.get("type") is None]
    # no request answered and unrecorded; those the change cut in flight (no answer) and the
    # kept-alive connections it closed are recorded `end: revoked`
    revoked = [r for r in requests if r.get("end") == "revoked"]
    assert all(r["host"] == "www.test" for r in revoked)
    # (refusals past the first 32 a second of one client and destination are one record
    # with a `count`: docs/audit-log.md#the-budget-per-sandbox)
    answered = sum(int(r.get("count", 1)) for r in requests) - len(revoked)
    assert answered == sum(len(s) for s in seen)
    applied = [r for r in records if r.get("type") == "policy"]
    assert [r["source"] for r in applied] == ["start", "sighup"]
    old, new = applied[0]["policy"], applied[1]["policy"]
    assert old != new
    assert applied[1]["canonical"]["block"] == ["www.test"]
    for r in requests:
        assert (r["policy"], r["decision"]) in ((old, "allow"), (new, "block"))
    rc, out, err = await run(sys.executable, "-m", "egress.cli", "audit", "verify", str(log))
    assert rc == 0, out + err


async def test_client_policy_replaced_from_the_api() -> None:
    origin = await start_origin(None, 0)  # on loopback: the guard lets its port through
    port = origin.port
    settings = build_settings({}, resolve=[f"www.test={origin.addr}", f"api.test={origin.addr}"])
    settings = exempt(settings, port)
    www, api = f"www.test:{port}", f"api.test:{port}"
    audit = MemoryAudit()
    curl = ("curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "5")
    try:
        async with EgressProxy(settings, audit=audit) as proxy:
            proxy.add_client(ClientSpec("sb", Policy(allow=[www]), token="t"))
            url = proxy.proxy_url("t", "sb")
            assert (await run(*curl, "-x", url, f"http://{www}/"))[1] == "200"
            assert (await run(*curl, "-x", url, f"http://{api}/"))[1] == "403"
            execution = Execution("ns", "sb", url, {}, {}, "t")
            update_execution(proxy, execution, Policy(allow=[api]))
            assert (await run(*curl, "-x", url, f"http://{www}/"))[1] == "403"
            assert (await run(*curl, "-x", url, f"http://{api}/"))[1] == "200"
            with pytest.raises(KeyError, match="nobody"):
                proxy.set_client_policy("nobody", Policy())
    finally:
        await origin.close()
    digests = [p["policy"] for p in audit.policies if p["client_id"] == "sb"]
    assert len(digests) == 2
    requests = [e for e in audit.events if e["method"] != "-"]
    assert [e["policy"] for e in requests] == [digests[0]] * 2 + [digests[1]] * 2
    # the upstream connection pooled for www.test was closed by the change, and recorded
    revoked = [(e["host"], e["end"], e["policy"]) for e in audit.events if e["method"] == "-"]
    assert revoked == [("www.test", "revoked", digests[1])]

"""Metrics, the admin listener, per-execution summaries and on_decision (docs/metrics.md).

Real proxy, real curl, real origin (on a loopback port the guard lets through, or in a test
namespace for `egress serve`); /metrics is read back with
prometheus_client's own text parser and compared with the audit log of the same traffic.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import signal
import sys
from collections import Counter
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from egress import AuditLog, ClientSpec, EgressProxy, Policy, Settings

import harness
from proxykit import MemoryAudit, exempt, raw_exchange
from servers import echo, run, start_origin, start_tcp


def parse_metrics(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Sample name -> [(labels, value)], through the reference parser."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def audit_counts(records: list[dict[str, object]]) -> Counter[tuple[str, str, str]]:
    return Counter(
        (str(r.get("client_id") or "-"), str(r["decision"]), str(r["reason"]))
        for r in records
        if r.get("type") in (None, "request")
    )


@pytest.mark.userns
async def test_serve_metrics_equal_the_audit_log(
    test_host: harness.TestHost, tmp_path: Path
) -> None:
    origin = await start_origin(test_host, 80)
    echo_srv = await start_tcp(test_host, 7000, echo)
    log = tmp_path / "audit.jsonl"
    policy = tmp_path / "policy.toml"
    policy.write_text(
        'allow = ["example.test", "example.test:7000"]\n'
        "[clients.sandbox-a]\n"
        'token = "s3cret"\n'
        'allow = ["example.test"]\n'
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "egress.cli",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
        "--policy",
        str(policy),
        "--resolve",
        f"example.test={test_host.addr_ns}",
        "--audit-log",
        str(log),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode().strip()
        assert line.startswith("listening on 127.0.0.1:")
        url = "http://" + line.removeprefix("listening on ")
        host, port = line.removeprefix("listening on ").rsplit(":", 1)
        admin = ""
        while not admin:
            err = (await asyncio.wait_for(proc.stderr.readline(), 20)).decode()
            if "admin on " in err:
                admin = err.split("admin on ", 1)[1].strip()
        assert admin.endswith("/metrics")
        curl = ("curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "5")
        for _ in range(3):
            assert (await run(*curl, "-x", url, "http://example.test/a"))[1] == "200"
        for path in ("http://other.test/", "http://example.test:8080/"):
            assert (await run(*curl, "-x", url, path))[1] == "403"
        token_url = url.replace("http://", "http://sandbox-a:s3cret@")
        assert (await run(*curl, "-x", token_url, "http://example.test/b"))[1] == "200"
        assert (await run(*curl, "-x", token_url, "http://example.test:7000/"))[1] == "403"
        assert b" 400 " in await raw_exchange(host, int(port), b"GET /origin-form HTTP/1.1\r\n\r\n")
        # a tunnel held open: the gauge shows it
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"CONNECT example.test:7000 HTTP/1.1\r\n\r\nping")
        await writer.drain()
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        assert await reader.readexactly(4) == b"ping"
        rc, text, err = await run("curl", "-sS", "--max-time", "5", admin)
        assert rc == 0, err
        open_now = parse_metrics(text)
        assert open_now["egress_open_tunnels"] == [({}, 1.0)]
        assert open_now["egress_open_connections"][0][1] >= 1.0
        writer.close()
        await writer.wait_closed()
        # the tunnel's record is written when it ends; wait for it through the health path
        for _ in range(200):
            rc, text, _ = await run("curl", "-sS", "--max-time", "5", admin)
            if parse_metrics(text)["egress_open_tunnels"] == [({}, 0.0)]:
                break
        samples = parse_metrics(text)
        rc, health, _ = await run("curl", "-sS", "--max-time", "5", admin[:-8] + "/healthz")
        assert health.strip() == "ok"
        rc, ready, _ = await run(*curl, admin[:-8] + "/readyz")
        assert ready == "200"
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 15) == 0
        tail = (await proc.stderr.read()).decode()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        echo_srv.close()
        await origin.close()
    records = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]
    expected = audit_counts(records)
    got = {
        (lab["client"], lab["decision"], lab["reason"]): value
        for lab, value in samples["egress_requests_total"]
    }
    assert got == {k: float(v) for k, v in expected.items()}
    assert got[("-", "allow", "allow_rule")] == 4.0  # 3 GETs and the tunnel
    assert sum(v for k, v in got.items() if k[0] == "sandbox-a") == 2.0
    requests = [r for r in records if r.get("type") in (None, "request")]
    up = {lab["client"]: v for lab, v in samples["egress_bytes_up_total"]}
    down = {lab["client"]: v for lab, v in samples["egress_bytes_down_total"]}
    for client in ("-", "sandbox-a"):
        mine = [r for r in requests if (r.get("client_id") or "-") == client]
        assert up[client] == sum(int(r.get("bytes_up", 0)) for r in mine)
        assert down[client] == sum(int(r.get("bytes_down", 0)) for r in mine)
    request_count = dict((lab["le"], v) for lab, v in samples["egress_request_seconds_bucket"])
    assert request_count["+Inf"] == len(requests)
    connect = dict((lab["le"], v) for lab, v in samples["egress_connect_seconds_bucket"])
    assert connect["+Inf"] >= 1
    assert samples["egress_decision_seconds_count"][0][1] >= len(requests) - 1
    # the shutdown summary counts what the log has
    assert f"egress serve: {len(requests)} requests" in tail


async def test_in_process_metrics_summary_and_callbacks(caplog: pytest.LogCaptureFixture) -> None:
    origin = await start_origin(None, 0)  # on loopback: the guard lets its port through
    site = f"example.test:{origin.port}"
    seen: list[dict[str, object]] = []

    def broken(_: dict[str, object]) -> None:
        raise RuntimeError("callback bug")

    settings = Settings(
        Policy(allow=[site]),
        resolve={"example.test": (ipaddress.ip_address(origin.addr),)},
        clients=(ClientSpec("exec-1", Policy(allow=[site]), token="t0k"),),
    )
    settings = exempt(settings, origin.port)
    audit = MemoryAudit()
    try:
        async with EgressProxy(settings, audit=audit, on_decision=[broken, seen.append]) as proxy:
            proxy.track_execution("exec-1")
            url = proxy.proxy_url("t0k", "exec-1")
            curl = ("curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "5")
            with caplog.at_level(logging.ERROR, logger="egress"):
                assert (await run(*curl, "-x", url, f"http://{site}/x?token=abc"))[1] == "200"
                for bad in ("evil.test", "other.test", "evil.test"):
                    assert (await run(*curl, "-x", url, f"http://{bad}/"))[1] == "403"
                assert (await run(*curl, "-x", proxy.url, f"http://{site}/"))[1] == "200"
            summary = proxy.execution_summary("exec-1", stop=True)
            snapshot = proxy.metrics()
            assert proxy.observers.callback_errors == 5
    finally:
        await origin.close()
    assert "callback bug" in caplog.text
    # the summary counts only exec-1's records
    assert summary.total == 4
    assert summary.by_decision == {"allow": 1, "block": 3}
    assert summary.by_reason == {"allow_rule": 1, "default_deny": 3}
    assert summary.by_host["evil.test"] == {"block": 2}
    assert summary.blocked_hosts == ["evil.test", "other.test"]
    # callbacks got every record, redacted (the query string is not passed on)
    requests = audit.events
    assert len(seen) == len(requests) == 5
    assert seen[0]["path"] == "/x?REDACTED"
    assert requests[0]["path"] == "/x?token=abc"  # the sink itself redacts on write
    # the policies in force were recorded when they started applying, and each request
    # names the one that decided it
    applied = {e["client_id"]: e["policy"] for e in audit.policies}
    assert applied == {None: settings.policy.digest, "exec-1": settings.clients[0].policy.digest}
    assert {(e["client_id"], e["policy"]) for e in requests} == set(applied.items())
    rows = {(r["client_id"], r["decision"]): r["count"] for r in snapshot["requests"]}  # type: ignore[attr-defined]
    assert rows == {("-", "allow"): 1, ("exec-1", "allow"): 1, ("exec-1", "block"): 3}


async def test_admin_readyz_reports_a_failing_audit_log() -> None:
    audit = MemoryAudit()
    async with EgressProxy(
        Policy(allow=["example.test"]), audit=audit, admin="127.0.0.1:0"
    ) as proxy:
        assert proxy.admin_url is not None
        _, out, _ = await run("curl", "-sS", "-w", " %{http_code}", proxy.admin_url + "/readyz")
        assert out.split() == ["ready", "200"]
        audit.accepting = False
        _rc, out, _ = await run("curl", "-sS", "-w", " %{http_code}", proxy.admin_url + "/readyz")
        assert out.split()[-1] == "503"
        assert "audit" in out


async def test_metrics_can_be_disabled_and_count_with_a_real_audit_log(
    tmp_path: Path,
) -> None:
    async with EgressProxy(Policy(allow=["example.test"]), metrics=False) as proxy:
        with pytest.raises(RuntimeError, match="disabled"):
            proxy.metrics()
    async with AuditLog(str(tmp_path / "a.jsonl")) as log:
        async with EgressProxy(Policy(), audit=log) as proxy:
            host, port = proxy.addresses[0]
            head = b"GET http://blocked.test/ HTTP/1.1\r\nConnection: close\r\n\r\n"
            await raw_exchange(host, port, head)
            assert proxy.metrics()["requests"] == [
                {"client_id": "-", "decision": "block", "reason": "default_deny", "count": 1}
            ]

"""Report-only mode and `egress audit suggest` (docs/policy.md#report-only-mode).

A report-mode proxy lets policy refusals through and records them as `would: block`, but the
address guard still refuses; the suggested policy, applied, allows exactly what was observed.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tomllib
from pathlib import Path

import pytest

from egress import AuditLog, EgressProxy, judge
from egress.check import parse_check_target
from egress.config import build_settings

import harness
from docexamples import examples, normalize
from proxykit import MemoryAudit, client_hello, exempt, raw_exchange
from servers import echo, port_of, run, start_origin, start_tcp


@pytest.mark.userns
async def test_report_mode_passes_traffic_and_suggest_allows_exactly_it(
    test_host: harness.TestHost, tmp_path: Path
) -> None:
    origin = await start_origin(test_host, 80)
    echo_srv = await start_tcp(test_host, 7000, echo)
    addr = test_host.addr_ns
    pins = [f"{h}={addr}" for h in ("www.test", "other.test", "echo.test", "blocked.test")]
    settings = build_settings(
        {"allow": ["www.test"], "block": ["blocked.test"], "mode": "report"},
        resolve=[*pins, "loopy.test=127.0.0.1"],
    )
    log_path = tmp_path / "audit.jsonl"
    curl = ("curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "5")
    try:
        async with AuditLog(str(log_path)) as log, EgressProxy(settings, audit=log) as proxy:
            codes = {
                url: (await run(*curl, "-x", proxy.url, url))[1]
                for url in (
                    "http://www.test/",
                    "http://other.test/a?x=1",
                    "http://blocked.test/",
                    "http://loopy.test/",
                )
            }
            host, port = proxy.addresses[0]
            reply = await raw_exchange(
                host, port, b"CONNECT echo.test:7000 HTTP/1.1\r\n\r\nhi", read_until_close=False
            )
            assert reply.startswith(b"HTTP/1.1 200")
    finally:
        echo_srv.close()
        await origin.close()
    # report mode: policy refusals pass, the guard does not
    assert codes == {
        "http://www.test/": "200",
        "http://other.test/a?x=1": "200",
        "http://blocked.test/": "200",
        "http://loopy.test/": "403",
    }
    records = [json.loads(x) for x in log_path.read_text().splitlines()]
    by_host = {r["host"]: r for r in records if r.get("host")}
    assert by_host["other.test"]["decision"] == "allow"
    assert by_host["other.test"]["would"] == "block"
    assert by_host["other.test"]["reason"] == "default_deny"
    assert by_host["blocked.test"]["would"] == "block"
    assert by_host["blocked.test"]["reason"] == "block_rule"
    assert "would" not in by_host["www.test"]
    assert by_host["loopy.test"]["decision"] == "block"
    assert by_host["loopy.test"]["reason"] == "reserved_address"
    assert by_host["echo.test"]["would"] == "block"

    rc, text, err = await run(
        sys.executable, "-m", "egress.cli", "audit", "suggest", "audit.jsonl", cwd=str(tmp_path)
    )
    assert rc == 0, err
    # docs/audit-log.md#egress-audit-suggest shows exactly this output
    [doc] = [e for e in examples() if e.needs.endswith(f"::{_this_test()}")]
    assert normalize(text) == normalize(doc.steps[0].expected)
    suggested = tomllib.loads(text)
    assert suggested["default"] == "deny"
    assert sorted(suggested["allow"]) == ["echo.test:7000", "http://other.test", "http://www.test"]
    assert "#   loopy.test:80  1 record(s)" in text  # reserved: called out, not allowed
    assert "#   blocked.test:80  1 record(s)  rule 'blocked.test'" in text
    # applied, it allows exactly what was observed
    applied = build_settings(suggested)
    observed = {"http://www.test/", "http://other.test/", "echo.test:7000"}
    probes = observed | {
        "https://www.test/",
        "http://www.test:8080/",
        "other.test:443",
        "echo.test:7001",
        "http://blocked.test/",
        "http://loopy.test/",
        "http://127.0.0.1/",
        "unseen.test",
    }
    for probe in sorted(probes):
        verdict = judge(applied.policy, applied.guard, parse_check_target(probe))
        assert verdict.allowed == (probe in observed), (probe, verdict)
    assert applied.policy.decide(parse_check_target("http://loopy.test/")).allowed is False


def _this_test() -> str:
    return "test_report_mode_passes_traffic_and_suggest_allows_exactly_it"


async def test_report_mode_per_client_and_cli_flag(tmp_path: Path) -> None:
    settings = build_settings(
        {"allow": ["a.test"], "clients": {"sb": {"token": "t", "mode": "report"}}}
    )
    assert not settings.policy.report_only
    assert settings.clients[0].policy.report_only
    forced = build_settings(
        {"allow": ["a.test"], "clients": {"sb": {"token": "t"}}}, report_only=True
    )
    assert forced.policy.report_only
    assert forced.clients[0].policy.report_only
    rc, out, _ = await run(
        sys.executable,
        "-m",
        "egress.cli",
        "check",
        "--report-only",
        "--allow",
        "a.test",
        "b.test",
        "http://127.0.0.1/",
    )
    lines = out.splitlines()
    assert lines[0].startswith("allow b.test default_deny: report-only, would block")
    assert lines[1].startswith("block http://127.0.0.1/ reserved_address")
    assert rc == 1


async def test_report_mode_sni_refusals_are_recorded_and_pass() -> None:
    # the upstream listens on a loopback port that the guard lets through; an https:// rule
    # makes its SNI checked as on 443 (docs/proxy.md#tls-sni-check)
    echo_srv = await start_tcp(None, 0, echo)
    tls_port = port_of(echo_srv)
    settings = build_settings(
        {"allow": [f"https://www.test:{tls_port}"], "mode": "report"},
        resolve=["www.test=127.0.0.1", "other.test=127.0.0.1"],
    )
    settings = exempt(settings, tls_port)
    audit = MemoryAudit()
    hello = client_hello("evil.test")
    try:
        async with EgressProxy(settings, audit=audit) as proxy:
            host, port = proxy.addresses[0]
            for name in ("www.test", "other.test"):
                reader, writer = await asyncio.open_connection(host, port)
                writer.write(f"CONNECT {name}:{tls_port} HTTP/1.1\r\n\r\n".encode() + hello)
                assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
                assert await reader.readexactly(len(hello)) == hello  # relayed, not cut
                writer.close()
                await audit.wait_for(method="CONNECT", host=name)
    finally:
        echo_srv.close()
    mismatch = audit.find(host="www.test")[0]
    assert (mismatch["decision"], mismatch["would"], mismatch["reason"]) == (
        "allow",
        "block",
        "sni_mismatch",
    )
    assert mismatch["sni"] == "evil.test"
    # the policy's own would-be refusal is the one recorded, not the SNI check's after it
    other = audit.find(host="other.test")[0]
    assert (other["decision"], other["would"], other["reason"]) == (
        "allow",
        "block",
        "default_deny",
    )

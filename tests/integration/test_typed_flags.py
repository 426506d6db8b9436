"""The red-team repros of issue 19 (MEDIUM): string flags that switched protection off.

`Policy(report_only="false")` let a blocked host through the proxy and in transparent mode;
`AuditLog(keep_query="false")` kept query strings in the audit log. Each case tries the
repro end to end: the flag must be refused up front (a TypeError naming it), or, if it were
accepted, the host must stay blocked and the query redacted. Before the fix the second branch
ran and failed (200 from the blocked host, the query in the log). docs/policy.md#types.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from egress import AuditLog, EgressProxy, Policy, prepare_execution, release_execution
from egress.config import Settings, build_settings, parse_resolve

from proxykit import exempt
from servers import run, start_origin

CURL = ("curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10")


def _policy_or_refusal(**flags: object) -> Policy | None:
    """The repro's policy, or None when the string flag is refused (naming it)."""
    try:
        return Policy(allow=["www.test"], block=["blocked.test"], **flags)  # type: ignore[arg-type]
    except TypeError as exc:
        refusal = str(exc)
    assert "report_only" in refusal
    return None


@pytest.mark.parametrize("flag", ["false", "0", "no"])
async def test_report_only_string_never_opens_a_blocked_host_via_the_proxy(flag: str) -> None:
    policy = _policy_or_refusal(report_only=flag)
    if policy is None:
        return  # refused before anything ran: the fix
    origin = await start_origin(None, 0)  # on loopback, and the guard lets its port through
    pins = [f"{h}={origin.addr}" for h in ("www.test", "blocked.test")]
    settings = exempt(Settings(policy=policy, resolve=parse_resolve(pins)), origin.port)
    try:
        async with EgressProxy(settings) as proxy:
            url = f"http://blocked.test:{origin.port}/"
            _, code, _ = await run(*CURL, "-x", proxy.url, url)
    finally:
        await origin.close()
    assert code == "403", "report_only='false' switched enforcement off"


@pytest.mark.netns
async def test_report_only_string_never_opens_a_blocked_host_in_transparent_mode(
    test_host_factory: object,
) -> None:
    policy = _policy_or_refusal(report_only="false")
    if policy is None:
        return
    sandbox = test_host_factory()  # type: ignore[operator]
    upstream = test_host_factory()  # type: ignore[operator]
    origin = await start_origin(upstream, 80)
    try:
        async with EgressProxy(build_settings({})) as proxy:
            execution = await prepare_execution(sandbox.ns, policy, proxy, transparent=True)
            try:
                # straight to the upstream's address: the proxy judges the Host, blocked.test
                _, code, _ = await run(
                    "ip", "netns", "exec", sandbox.ns, *CURL, "--noproxy", "*", "--resolve",
                    f"blocked.test:80:{upstream.addr_ns}", "http://blocked.test/",
                )  # fmt: skip
            finally:
                await release_execution(proxy, execution, restore=True)
    finally:
        await origin.close()
    assert code == "403", "report_only='false' switched enforcement off in transparent mode"


async def test_keep_query_string_never_keeps_query_strings(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    try:
        log = AuditLog(str(path), keep_query="false")  # type: ignore[arg-type]
    except TypeError as exc:
        refusal = str(exc)
    else:
        refusal = ""
    if refusal:
        assert "keep_query" in refusal
        return
    origin = await start_origin(None, 0)
    www = f"www.test:{origin.port}"
    settings = build_settings({"allow": [www]}, resolve=[f"www.test={origin.addr}"])
    try:
        async with log, EgressProxy(exempt(settings, origin.port), audit=log) as proxy:
            await run(*CURL, "-x", proxy.url, f"http://{www}/?secret=hunter2")
    finally:
        await origin.close()
    records = [json.loads(x) for x in path.read_text().splitlines()]
    assert not any("hunter2" in json.dumps(r) for r in records), "the query string was kept"


@pytest.mark.parametrize("flag", ["reuse_port", "require_auth", "metrics"])
def test_proxy_flags_are_booleans(flag: str) -> None:
    with pytest.raises(TypeError, match=f"EgressProxy {flag} must be a boolean"):
        EgressProxy(Policy(), **{flag: "false"})  # type: ignore[arg-type]

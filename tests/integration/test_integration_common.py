"""What every framework integration stands on (issue 21, docs/integrations.md): the
forwarder port fallback against any socket bound in the sandbox, `ExecutionNotReady.kind`,
`EgressProxy(resolve=...)`, `plan_execution` and `shared_proxy()`'s lifecycle. Real
namespaces, real sockets, `curl` as the agent."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web

import netcut
from egress import (
    EgressProxy,
    ExecutionNotReady,
    Policy,
    PolicyError,
    client_id_from,
    plan_execution,
    prepare_execution,
    release_execution,
    shared_proxy,
)
from egress.proxy.net.netns import listen_in_netns

import harness
import userns
from servers import Origin, run, start_origin


@dataclass
class Scene:
    sandbox: harness.TestHost
    upstream: harness.TestHost
    origin: Origin
    route: str
    route_port: int
    proxy: EgressProxy


@pytest.fixture
async def scene(test_host_factory: object) -> AsyncIterator[Scene]:
    sandbox = test_host_factory()  # type: ignore[operator]
    upstream = test_host_factory()  # type: ignore[operator]
    origin = await start_origin(upstream, 80)

    async def service(request: web.Request) -> web.Response:
        return web.json_response({"service": True, "path": request.path})

    app = web.Application()
    app.router.add_get("/{tail:.*}", service)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    proxy = EgressProxy(Policy(), listen=(), resolve={"api.test": upstream.addr_ns})
    await proxy.start()
    try:
        yield Scene(sandbox, upstream, origin, f"http://127.0.0.1:{port}/v1", port, proxy)
    finally:
        await proxy.stop()
        await runner.cleanup()
        await origin.close()
        await netcut.restore_async(sandbox.ns)


async def curl(host: harness.TestHost, *args: str) -> tuple[str, str]:
    """`curl` inside `host` without capabilities: (status code, body)."""
    _, out, _ = await run(
        "ip",
        "netns",
        "exec",
        host.ns,
        *userns.CAPLESS,
        "curl",
        "-s",
        "--max-time",
        "5",
        "-w",
        "\n%{http_code}",
        *args,
    )
    body, _, code = out.rpartition("\n")
    return code, body


@pytest.mark.userns
async def test_forwarder_moves_off_a_port_bound_by_anything_in_the_sandbox(scene: Scene) -> None:
    # the framework's own service already listens on the route's port inside the sandbox
    # (before: prepare_execution failed with EADDRINUSE; the fallback only saw our listeners)
    squatter = listen_in_netns(scene.sandbox.ns, "0.0.0.0", scene.route_port)
    try:
        plan = plan_execution("run-1", framework_routes=[scene.route])
        ex = await prepare_execution(
            scene.sandbox.ns,
            Policy(allow=["api.test"]),
            scene.proxy,
            framework_routes=[scene.route],
            client_id=plan.client_id,
            token=plan.token,
        )
        moved = ex.framework_urls[scene.route]
        assert moved != scene.route
        assert not plan.holds(ex)  # the plan said the route's own port; it was taken
        assert ex.proxy_url == plan.proxy_url
        assert ex.env == plan.env
        code, body = await curl(scene.sandbox, "--noproxy", "*", moved)
        assert code == "200"
        assert json.loads(body) == {"service": True, "path": "/v1"}
        # the pinned name (EgressProxy(resolve=...)) is what the proxy dials
        code, _ = await curl(scene.sandbox, "-x", ex.proxy_url, "http://api.test/x")
        assert code == "200"
        assert [s.path for s in scene.origin.seen] == ["/x"]
        await release_execution(scene.proxy, ex, restore=True)
    finally:
        squatter.close()


@pytest.mark.userns
async def test_plan_holds_when_the_ports_are_free(scene: Scene) -> None:
    plan = plan_execution(client_id_from("sample/7", 1), framework_routes=[scene.route])
    assert plan.client_id == "sample-7-1"
    ex = await prepare_execution(
        scene.sandbox.ns,
        Policy(),
        scene.proxy,
        framework_routes=[scene.route],
        client_id=plan.client_id,
        token=plan.token,
    )
    assert plan.holds(ex)
    assert ex.framework_urls == {scene.route: scene.route}
    assert plan.env["HTTPS_PROXY"] == ex.env["HTTPS_PROXY"]
    await release_execution(scene.proxy, ex, restore=True)


@pytest.mark.userns
async def test_a_taken_proxy_port_is_port_in_use(scene: Scene) -> None:
    squatter = listen_in_netns(scene.sandbox.ns, "127.0.0.1", 3128)
    try:
        with pytest.raises(ExecutionNotReady) as info:
            await prepare_execution(scene.sandbox.ns, Policy(), scene.proxy)
        assert info.value.kind == "port_in_use"
        assert isinstance(info.value.__cause__, OSError)
    finally:
        squatter.close()


@pytest.mark.userns
async def test_a_failed_probe_says_so(scene: Scene) -> None:
    with pytest.raises(ExecutionNotReady) as info:
        await prepare_execution(
            scene.sandbox.ns,
            Policy(),
            scene.proxy,
            expect_blocked=["127.0.0.1:3128"],  # the proxy itself answers there
        )
    assert info.value.kind == "probe_failed"


def test_resolve_is_checked() -> None:
    proxy = EgressProxy(Policy(), resolve={"API.test": ["198.18.0.2", "198.18.0.3"]})
    assert [str(a) for a in proxy.settings.resolve["api.test"]] == ["198.18.0.2", "198.18.0.3"]
    with pytest.raises(PolicyError, match="not an IP address"):
        EgressProxy(Policy(), resolve={"api.test": "nowhere"})
    with pytest.raises(TypeError):
        EgressProxy(Policy(), resolve=["api.test=198.18.0.2"])  # type: ignore[arg-type]


def test_client_id_from_keeps_url_safe_characters() -> None:
    assert client_id_from("run:1@x", "sample 3") == "run-1-x-sample-3"
    assert len(client_id_from("x" * 200)) == 64
    with pytest.raises(ValueError, match="no usable"):
        client_id_from("::")


async def test_one_shared_proxy_per_loop() -> None:
    a, b = await asyncio.gather(shared_proxy(), shared_proxy())
    assert a is b
    assert await shared_proxy() is a
    from egress import close_shared_proxy

    await close_shared_proxy()
    assert a.closing
    c = await shared_proxy()
    assert c is not a
    await close_shared_proxy()


def test_shared_proxy_is_stopped_and_its_audit_flushed_when_asyncio_run_ends(
    tmp_path: Path,
) -> None:
    # a framework's own asyncio.run: nobody calls close_shared_proxy; the log still ends
    log = tmp_path / "audit.jsonl"
    script = textwrap.dedent(
        f"""
        import asyncio, egress
        egress.configure_shared_proxy(audit={str(log)!r})
        async def main():
            await egress.shared_proxy()  # never closed here
        asyncio.run(main())
        asyncio.run(main())
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    kinds = [json.loads(line)["type"] for line in log.read_text().splitlines()]
    assert kinds.count("start") == 2, kinds
    assert kinds.count("end") == 2, kinds
    verify = subprocess.run(
        [sys.executable, "-m", "egress.cli", "audit", "verify", str(log)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr


async def test_shared_proxy_pins_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # a framework's own CLI (harbor trials start, vf-eval): no code to configure pins with
    from egress import close_shared_proxy

    monkeypatch.setenv("EGRESS_RESOLVE", "api.test=198.18.0.2, api.test=198.18.0.3 b.test=::1")
    proxy = await shared_proxy()
    try:
        assert [str(a) for a in proxy.resolver.pins["api.test"]] == ["198.18.0.2", "198.18.0.3"]
        assert [str(a) for a in proxy.resolver.pins["b.test"]] == ["::1"]
    finally:
        await close_shared_proxy()
    monkeypatch.setenv("EGRESS_RESOLVE", "api.test")
    with pytest.raises(PolicyError, match=r"EGRESS_RESOLVE 'api\.test': expected NAME=ADDR"):
        await shared_proxy()

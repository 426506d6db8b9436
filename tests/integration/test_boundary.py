"""The execution boundary end to end, through the public API only (docs/user-guide.md#the-flow).

Topology: `sandbox` and `upstream` are test hosts; a direct veth joins them (setup traffic
goes that way), and the proxy in this process reaches `upstream` through its own veth.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from aiohttp import web

import netcut
from egress import (
    EgressProxy,
    ExecutionNotReady,
    Policy,
    build_settings,
    prepare_execution,
    release_execution,
)

import harness
from servers import Origin, run, start_origin

pytestmark = pytest.mark.netns

AGENT = [
    "setpriv",
    "--reuid=65534",
    "--regid=65534",
    "--clear-groups",
    "--inh-caps=-all",
    "--bounding-set=-all",
    "--",
]


@dataclass
class Scene:
    sandbox: harness.TestHost
    upstream: harness.TestHost
    direct: harness.Link
    origin: Origin
    route_port: int
    proxy: EgressProxy


@pytest.fixture
async def scene(test_host_factory: object) -> AsyncIterator[Scene]:
    sandbox = test_host_factory()  # type: ignore[operator]
    upstream = test_host_factory()  # type: ignore[operator]
    direct = harness.link(sandbox, upstream)
    origin = await start_origin(upstream, 80)

    async def model(request: web.Request) -> web.Response:
        return web.json_response({"model": "ok", "path": request.path})

    app = web.Application()
    app.router.add_get("/{tail:.*}", model)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    route_port = runner.addresses[0][1]
    settings = build_settings(
        {},
        resolve=[
            f"pypi.test={upstream.addr_ns}",
            f"evil.test={upstream.addr_ns}",
            "loopy.test=127.0.0.1",
        ],
    )
    proxy = EgressProxy(settings, listen=["127.0.0.1:0"])
    await proxy.start()
    try:
        yield Scene(sandbox, upstream, direct, origin, route_port, proxy)
    finally:
        await proxy.stop()
        await runner.cleanup()
        await origin.close()


async def in_sandbox(scene: Scene, env: dict[str, str], *argv: str) -> tuple[int, str, str]:
    envargs = [f"{k}={v}" for k, v in env.items()]
    return await run(
        "ip",
        "netns",
        "exec",
        scene.sandbox.ns,
        "env",
        "-i",
        "PATH=/usr/bin:/bin",
        *envargs,
        *AGENT,
        *argv,
    )


async def test_setup_then_cut_then_agent_behind_proxy(scene: Scene) -> None:
    up = scene.direct.addr_b
    # setup: online, straight to the upstream over the direct link
    rc, out, err = await in_sandbox(
        scene, {}, "curl", "-sS", "--max-time", "5", f"http://{up}/setup"
    )
    assert rc == 0, err
    assert json.loads(out)["path"] == "/setup"

    policy = Policy(allow=["pypi.test"], block=["evil.test"])
    route = f"http://127.0.0.1:{scene.route_port}/v1"
    execution = await prepare_execution(
        scene.sandbox.ns,
        policy,
        scene.proxy,
        framework_routes=[route],
        expect_blocked=[f"{up}:80"],
    )
    env = dict(execution.env)
    assert env["HTTPS_PROXY"] == env["https_proxy"] == execution.proxy_url
    assert "127.0.0.1" in env["NO_PROXY"].split(",")

    # the agent, with no capabilities, reaches an allowed host through the proxy
    rc, out, err = await in_sandbox(
        scene, env, "curl", "-sS", "--max-time", "5", "http://pypi.test/simple/"
    )
    assert rc == 0, err
    assert json.loads(out)["path"] == "/simple/"
    # ... is refused a blocked host, with the reason
    rc, out, err = await in_sandbox(
        scene, env, "curl", "-sS", "-i", "--max-time", "5", "http://evil.test/"
    )
    assert " 403 " in out.splitlines()[0]
    assert "evil.test" in out
    # ... cannot connect directly (the route is gone, and the backstop drops it)
    rc, out, err = await in_sandbox(
        scene, env, "curl", "-sS", "--noproxy", "*", "--max-time", "3", f"http://{up}/direct"
    )
    assert rc != 0
    # ... cannot re-add a route (no capabilities)
    rc, _, _ = await in_sandbox(
        scene, env, "ip", "route", "add", "default", "via", scene.sandbox.addr_root
    )
    assert rc != 0
    # ... a loopback trick through the proxy is refused
    rc, out, _ = await in_sandbox(
        scene, env, "curl", "-sS", "-i", "--max-time", "5", "http://loopy.test/"
    )
    assert " 403 " in out.splitlines()[0]
    # ... and reaches the framework route at its rewritten URL, directly on its loopback
    url = execution.framework_urls[route]
    assert url.startswith("http://127.0.0.1:")
    rc, out, err = await in_sandbox(scene, env, "curl", "-sS", "--max-time", "5", url + "/models")
    assert rc == 0, err
    assert json.loads(out) == {"model": "ok", "path": "/v1/models"}
    assert [s.path for s in scene.origin.seen] == ["/setup", "/simple/"]

    # calling it twice is safe and hands out the same proxy
    again = await prepare_execution(
        scene.sandbox.ns,
        policy,
        scene.proxy,
        framework_routes=[route],
        token=execution.token,
    )
    assert again.proxy_url == execution.proxy_url
    # each prepare's probe connects to the forwarder; the second one's record may land
    # just after prepare returns (it is the forwarder's, on the proxy's loop)
    deadline = asyncio.get_running_loop().time() + 5
    while asyncio.get_running_loop().time() < deadline:
        so_far = scene.proxy.execution_summary(execution.client_id)
        if so_far.by_reason.get("framework_route", 0) >= 3:
            break
        await asyncio.sleep(0.01)
    summary = await release_execution(scene.proxy, execution, restore=True)
    assert not (await netcut.status_async(scene.sandbox.ns)).is_cut
    # what this execution did, counted from its access records (docs/metrics.md)
    assert summary.client_id == execution.client_id
    assert summary.by_host["pypi.test"] == {"allow": 1}
    assert set(summary.blocked_hosts) == {"evil.test", "loopy.test"}
    assert summary.by_reason == {
        "allow_rule": 1,
        "block_rule": 1,
        "default_deny": 1,
        "framework_route": 3,
    }  # the two probes' and the agent's
    assert summary.by_decision == {"allow": 4, "block": 2}


async def test_fails_closed_when_the_cut_cannot_be_proven(scene: Scene) -> None:
    # the upstream stays reachable on a kept address: the probe must refuse to hand out an env
    with pytest.raises(ExecutionNotReady):
        await prepare_execution(
            scene.sandbox.ns,
            Policy(),
            scene.proxy,
            expect_blocked=[f"127.0.0.1:{3128}"],  # the proxy itself answers: not blocked
        )
    await netcut.restore_async(scene.sandbox.ns)


async def test_gateway_mode_keeps_only_the_proxy_on_the_gateway(scene: Scene) -> None:
    up = scene.direct.addr_b
    policy = Policy(allow=["pypi.test"])
    route = f"http://127.0.0.1:{scene.route_port}/v1"
    execution = await prepare_execution(
        scene.sandbox.ns,
        policy,
        scene.proxy,
        framework_routes=[route],
        mode="gateway",
        proxy_port=0,
        expect_blocked=[f"{up}:80"],
    )
    gateway = scene.sandbox.addr_root
    assert f"@{gateway}:" in execution.proxy_url
    assert execution.framework_urls[route].startswith(f"http://{gateway}:")
    env = dict(execution.env)
    assert env["NO_PROXY"] == gateway
    rc, out, err = await in_sandbox(
        scene, env, "curl", "-sS", "--max-time", "5", "http://pypi.test/gw"
    )
    assert rc == 0, err
    assert json.loads(out)["path"] == "/gw"
    rc, out, err = await in_sandbox(
        scene, env, "curl", "-sS", "--max-time", "5", execution.framework_urls[route] + "/m"
    )
    assert rc == 0, err
    assert json.loads(out)["path"] == "/v1/m"
    # without the token, the shared gateway listener knows the sandbox by its address
    proxy_at = f"http://{gateway}:{execution.listeners[0].port}"
    rc, out, err = await in_sandbox(
        scene, {}, "curl", "-sS", "--max-time", "5", "-x", proxy_at, "http://pypi.test/anon"
    )
    assert rc == 0, err
    assert json.loads(out)["path"] == "/anon"
    # a wrong token is refused, and another host without a token gets the proxy's own policy
    rc, out, _ = await in_sandbox(
        scene,
        {},
        "curl",
        "-sS",
        "-i",
        "--max-time",
        "5",
        "-x",
        proxy_at.replace("http://", "http://x:wrong@"),
        "http://pypi.test/",
    )
    assert " 407 " in out.splitlines()[0]
    rc, out, _ = await run(
        "ip",
        "netns",
        "exec",
        scene.upstream.ns,
        "curl",
        "-sS",
        "-i",
        "--max-time",
        "5",
        "-x",
        proxy_at,
        "http://pypi.test/",
    )
    assert " 403 " in out.splitlines()[0]
    await release_execution(scene.proxy, execution, restore=True)


async def test_gateway_mode_keeps_its_socks5_listener(scene: Scene) -> None:
    """A SOCKS5 listener opened on the gateway is kept by the cut and probed from inside
    (it used to be probed but not kept, and every such prepare failed)."""
    execution = await prepare_execution(
        scene.sandbox.ns,
        Policy(),
        scene.proxy,
        mode="gateway",
        proxy_port=0,
        socks_port=0,
    )
    socks = execution.listeners[-1]
    assert socks.kind == "socks5"
    assert socks.host == scene.sandbox.addr_root
    assert f"{socks.host}:{socks.port}" in {str(k) for k in execution.cut.plan.keeps}
    assert execution.probe.ok
    await release_execution(scene.proxy, execution, restore=True)
    assert not (await netcut.status_async(scene.sandbox.ns)).is_cut

"""No state crosses sandboxes (issue 11): the real API, in real namespaces.

Topology: `sandbox` (and `other`) are test hosts; `upstream` holds an origin the proxy in this
process reaches over its veth; a framework service listens on the host's loopback. Agents
are `curl` inside the sandboxes, without capabilities.

Every leak of the red-team pass is a test here: a verdict cached under a freed policy's id
and reused by the next sandbox (many prepare/release rounds, garbage collected in between),
a released gateway sandbox's token and source address still identifying it, a shared
gateway listener closed under another sandbox, a second prepare keeping the first policy, a
failed prepare leaving its listener open, and a failed restore swallowed.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import hypothesis.strategies as st
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings

import netcut
from egress import EgressProxy, Policy, build_settings, prepare_execution, release_execution
from egress.boundary import ExecutionNotReady, ReleaseFailed
from egress.boundary.sandboxes import Sandboxes
from egress.proxy.net.netns import call_in_netns_thread

import harness
import userns
from servers import Origin, run, start_origin

pytestmark = pytest.mark.userns

AGENT = userns.CAPLESS
ROUNDS = 200


@dataclass
class Scene:
    sandbox: harness.TestHost
    other: harness.TestHost
    upstream: harness.TestHost
    origin: Origin
    route: str
    proxy: EgressProxy
    events: list[dict[str, object]] = field(default_factory=list)

    @property
    def ip(self) -> str:
        return self.upstream.addr_ns

    def lifecycle(self) -> list[tuple[object, object]]:
        return [(e["host"], e["reason"]) for e in self.events if e.get("method") == "SANDBOX"]


@pytest.fixture
async def scene(test_host_factory: object) -> AsyncIterator[Scene]:
    sandbox = test_host_factory()  # type: ignore[operator]
    other = test_host_factory()  # type: ignore[operator]
    upstream = test_host_factory()  # type: ignore[operator]
    origin = await start_origin(upstream, 80)

    async def service(request: web.Request) -> web.Response:
        return web.json_response({"host-loopback": True})

    app = web.Application()
    app.router.add_get("/{tail:.*}", service)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    route = f"http://127.0.0.1:{runner.addresses[0][1]}"
    # the same service by name: a framework route by name is not re-judged after resolution
    proxy = EgressProxy(build_settings({}, resolve=["svc.test=127.0.0.1"]), listen=["127.0.0.1:0"])
    await proxy.start()
    scene = Scene(sandbox, other, upstream, origin, route, proxy)
    proxy.hooks.append(scene.events.append)
    try:
        yield scene
    finally:
        await proxy.stop()
        await runner.cleanup()
        await origin.close()
        for host in (sandbox, other):
            with contextlib.suppress(netcut.NetcutError):
                await netcut.restore_async(host.ns)


async def codes(host: harness.TestHost, proxy_url: str | None, *urls: str) -> list[str]:
    """HTTP status codes `curl` (no capabilities) gets inside `host` for each URL."""
    proxy = ["-x", proxy_url] if proxy_url else ["--noproxy", "*"]
    outs = [a for _ in urls for a in ("-o", "/dev/null")]
    _, out, _ = await run(
        "ip",
        "netns",
        "exec",
        host.ns,
        *AGENT,
        "curl",
        "-s",
        "--max-time",
        "5",
        *proxy,
        *outs,
        "-w",
        "%{http_code}\\n",
        *urls,
    )
    return out.split()


def assert_nothing_left(scene: Scene, listeners_before: int) -> None:
    assert len(scene.proxy.listeners) == listeners_before
    assert scene.proxy.clients.client_ids == ()
    assert scene.proxy.settings.clients == ()
    assert not Sandboxes(scene.proxy).held


@pytest.mark.timeout(600)  # 200 real rounds: ~20 s on an idle machine, more when shared
async def test_no_verdict_survives_its_sandbox_over_many_rounds(scene: Scene) -> None:
    """Alternate `Policy(allow=[IP])` / `Policy()` and framework routes on/off over ROUNDS
    prepare/release rounds, garbage collected in between: every request gets exactly its own
    sandbox's verdict (before: 10 of 60 allow-nothing tasks reached the IP, and 50 of 100
    tasks without the route reached the host's loopback service)."""
    before = len(scene.proxy.listeners)
    named = scene.route.replace("127.0.0.1", "svc.test")
    target, service, by_name = f"http://{scene.ip}/leak", f"{scene.route}/leak", f"{named}/leak"
    leaks: list[tuple[int, str, str]] = []
    kept: list[int] = []
    for i in range(ROUNDS):
        allow_ip, with_route = i % 2 == 0, (i // 2) % 2 == 0
        policy = Policy(allow=[scene.ip]) if allow_ip else Policy()
        execution = await prepare_execution(
            scene.sandbox.ns,
            policy,
            scene.proxy,
            framework_routes=[scene.route, named] if with_route else [],
        )
        got = await codes(scene.sandbox, execution.proxy_url, target, service, by_name)
        want = ["200" if allow_ip else "403", *(["200" if with_route else "403"] * 2)]
        if got != want:
            leaks.append((i, str(got), str(want)))
        identity = execution.listeners[0].identity
        assert identity is not None
        bound = weakref.ref(identity.policy)
        await release_execution(scene.proxy, execution)
        del execution, policy, identity
        gc.collect()
        if bound() is not None:  # the proxy kept something of a released sandbox
            kept.append(i)
    assert leaks == []
    assert kept == []
    assert_nothing_left(scene, before)


async def test_gateway_release_forgets_token_and_source_and_keeps_shared_listener(
    scene: Scene,
) -> None:
    before = len(scene.proxy.listeners)
    gw = scene.sandbox.addr_root  # both sandboxes reach the host at this address
    a = await prepare_execution(
        scene.sandbox.ns,
        Policy(allow=[scene.ip]),
        scene.proxy,
        mode="gateway",
        gateway=gw,
        proxy_port=0,
    )
    b = await prepare_execution(
        scene.other.ns,
        Policy(allow=[scene.ip]),
        scene.proxy,
        mode="gateway",
        gateway=gw,
        proxy_port=0,
    )
    shared = a.listeners[0]
    assert b.listeners[0] is shared  # one listener, two holders
    bare = f"http://{gw}:{shared.port}"
    target = f"http://{scene.ip}/gw"
    assert await codes(scene.sandbox, bare, target) == ["200"]  # known by its source address
    assert await codes(scene.other, b.proxy_url, target) == ["200"]

    await release_execution(scene.proxy, a)
    # B's proxy is still there: releasing A did not close the shared listener under B
    assert shared in scene.proxy.listeners
    assert await codes(scene.other, b.proxy_url, target) == ["200"]
    # A's source address and token identify nobody any more (before: both kept A's policy)
    assert await codes(scene.sandbox, bare, target) == ["403"]
    assert await codes(scene.sandbox, a.proxy_url, target) == ["407"]
    assert await codes(scene.other, a.proxy_url, target) == ["407"]

    await release_execution(scene.proxy, b)
    assert shared not in scene.proxy.listeners
    await release_execution(scene.proxy, b)  # twice is harmless
    await release_execution(scene.proxy, a)
    assert_nothing_left(scene, before)
    assert scene.lifecycle() == [
        (scene.sandbox.ns, "sandbox_added"),
        (scene.other.ns, "sandbox_added"),
        (scene.sandbox.ns, "sandbox_removed"),
        (scene.other.ns, "sandbox_removed"),
    ]


@pytest.mark.parametrize("mode", ["loopback", "gateway"])
async def test_second_prepare_replaces_the_policy_atomically(scene: Scene, mode: str) -> None:
    before = len(scene.proxy.listeners)
    target = f"http://{scene.ip}/again"
    kw: dict[str, object] = {"mode": mode, "proxy_port": 0 if mode == "gateway" else 3128}
    first = await prepare_execution(
        scene.sandbox.ns,
        Policy(allow=[scene.ip]),
        scene.proxy,
        framework_routes=[scene.route],
        **kw,
    )  # type: ignore[arg-type]
    assert await codes(scene.sandbox, first.proxy_url, target) == ["200"]
    # a narrower second policy: before, the first policy silently stayed
    routes = [scene.route] if mode == "gateway" else []  # a gateway cut keeps its ports
    second = await prepare_execution(
        scene.sandbox.ns, Policy(), scene.proxy, framework_routes=routes, **kw
    )  # type: ignore[arg-type]
    assert second.proxy_url == first.proxy_url  # same listener, same token
    assert await codes(scene.sandbox, second.proxy_url, target) == ["403"]
    if mode == "loopback":
        # the dropped route is refused, and its forwarder is closed
        assert await codes(scene.sandbox, second.proxy_url, scene.route) == ["403"]
        fwd = first.framework_urls[scene.route]
        assert await codes(scene.sandbox, None, fwd) == ["000"]
    else:
        with pytest.raises(ExecutionNotReady, match="keeps its framework routes"):
            await prepare_execution(scene.sandbox.ns, Policy(), scene.proxy, **kw)  # type: ignore[arg-type]
        assert await codes(scene.sandbox, second.proxy_url, target) == ["403"]  # unchanged
    assert [r for _, r in scene.lifecycle()] == ["sandbox_added", "sandbox_replaced"]
    await release_execution(scene.proxy, second)
    assert_nothing_left(scene, before)


async def test_failed_prepare_leaves_nothing_open(scene: Scene) -> None:
    before = len(scene.proxy.listeners)
    with pytest.raises(ExecutionNotReady, match="probe failed"):
        await prepare_execution(
            scene.sandbox.ns,
            Policy(allow=[scene.ip]),
            scene.proxy,
            framework_routes=[scene.route],
            expect_blocked=["127.0.0.1:3128"],
        )
    assert_nothing_left(scene, before)
    # nothing answers inside the sandbox any more (before: the proxy listener stayed open)
    assert await codes(scene.sandbox, None, "http://127.0.0.1:3128/") == ["000"]
    assert [r for _, r in scene.lifecycle()] == ["sandbox_removed"]
    # and the sandbox can be prepared afresh
    ok = await prepare_execution(scene.sandbox.ns, Policy(allow=[scene.ip]), scene.proxy)
    assert await codes(scene.sandbox, ok.proxy_url, f"http://{scene.ip}/") == ["200"]
    await release_execution(scene.proxy, ok, restore=True)
    assert not (await netcut.status_async(scene.sandbox.ns)).is_cut


async def test_a_client_id_belongs_to_one_sandbox(scene: Scene) -> None:
    a = await prepare_execution(scene.sandbox.ns, Policy(), scene.proxy, client_id="same")
    with pytest.raises(ExecutionNotReady, match="already used by sandbox"):
        await prepare_execution(scene.other.ns, Policy(), scene.proxy, client_id="same")
    assert await codes(scene.sandbox, a.proxy_url, f"http://{scene.ip}/") == ["403"]
    await release_execution(scene.proxy, a)


async def test_failed_restore_raises(scene: Scene, test_host_factory: object) -> None:
    doomed = test_host_factory()  # type: ignore[operator]
    execution = await prepare_execution(doomed.ns, Policy(), scene.proxy)
    doomed.remove()  # the namespace is gone: the cut cannot be undone
    with pytest.raises(ReleaseFailed, match="restore failed"):
        await release_execution(scene.proxy, execution, restore=True)
    # the proxy side was released all the same
    assert execution.listeners[0] not in scene.proxy.listeners


# --- random lifecycles against a model, in real namespaces --------------------------------

KINDS = ["allow_ip", "nothing", "route"]
_HOSTS: dict[int, list[harness.TestHost]] = {}
OPS = st.one_of(
    st.tuples(st.just("prepare"), st.integers(0, 1), st.sampled_from(KINDS)),
    st.tuples(st.just("release"), st.integers(0, 1), st.just("")),
    st.tuples(st.just("request"), st.integers(0, 1), st.just("")),
)


@pytest.mark.userns
@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=st.lists(OPS, min_size=1, max_size=8))
def test_random_lifecycles_follow_the_model(
    test_host_factory: object, ops: list[tuple[str, int, str]]
) -> None:
    """Random prepare (any of three policies) / release / request sequences on two sandboxes
    sharing one proxy: every request gets exactly the policy the model says, and a released
    sandbox's listener answers nothing."""
    # two sandboxes and an upstream, made once per test (each example restores them)
    hosts = _HOSTS.get(id(test_host_factory))
    if hosts is None:
        _HOSTS.clear()
        hosts = _HOSTS[id(test_host_factory)] = [test_host_factory() for _ in range(3)]  # type: ignore[operator]
    asyncio.run(_random_lifecycle(hosts, ops))


async def _random_lifecycle(hosts: list[harness.TestHost], ops: list[tuple[str, int, str]]) -> None:
    boxes, upstream = hosts[:2], hosts[2]
    origin = await start_origin(upstream, 0)  # a fresh port for every example
    at = f"{upstream.addr_ns}:{origin.runner.addresses[0][1]}"

    async def service(request: web.Request) -> web.Response:
        return web.json_response({})

    app = web.Application()
    app.router.add_get("/{tail:.*}", service)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    route = f"http://127.0.0.1:{runner.addresses[0][1]}"
    proxy = EgressProxy(build_settings({}), listen=["127.0.0.1:0"])
    await proxy.start()
    model: dict[int, str | None] = {0: None, 1: None}
    urls: dict[int, str] = {}
    live: dict[int, object] = {}
    try:
        for op, box, kind in ops:
            if op == "prepare":
                policy = Policy(allow=[at]) if kind == "allow_ip" else Policy()
                routes = [route] if kind == "route" else []
                execution = await prepare_execution(
                    boxes[box].ns, policy, proxy, framework_routes=routes
                )
                live[box], urls[box], model[box] = execution, execution.proxy_url, kind
            elif op == "release" and box in live:
                await release_execution(proxy, live.pop(box))  # type: ignore[arg-type]
                model[box] = None
            elif op == "request" and box in urls:
                got = await codes(boxes[box], urls[box], f"http://{at}/r", f"{route}/r")
                want = {
                    None: ["000", "000"],
                    "allow_ip": ["200", "403"],
                    "nothing": ["403", "403"],
                    "route": ["403", "200"],
                }[model[box]]
                assert got == want, (ops, box, model)
                gc.collect()
        for execution in live.values():
            await release_execution(proxy, execution, restore=True)  # type: ignore[arg-type]
        assert proxy.clients.client_ids == ()
        assert len(proxy.listeners) == 1
    finally:
        await proxy.stop()
        await runner.cleanup()
        await origin.close()
        for host in boxes:
            with contextlib.suppress(netcut.NetcutError):
                await netcut.restore_async(host.ns)


async def test_release_closes_connections_open_on_the_sandbox_listener(scene: Scene) -> None:
    """A tunnel opened before the release does not outlive it with the old policy."""
    execution = await prepare_execution(
        scene.sandbox.ns, Policy(allow=[f"{scene.ip}:80"]), scene.proxy
    )
    port = execution.listeners[0].port

    def connect() -> socket.socket:  # a socket made inside the sandbox stays in it
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.setblocking(False)
        return sock

    tunnel_logged = asyncio.Event()
    scene.proxy.hooks.append(lambda e: tunnel_logged.set() if e["method"] == "CONNECT" else None)
    sock = call_in_netns_thread(scene.sandbox.ns, connect)
    reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(f"CONNECT {scene.ip}:80 HTTP/1.1\r\nHost: {scene.ip}:80\r\n\r\n".encode())
    async with asyncio.timeout(5):
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        await release_execution(scene.proxy, execution)
        assert await reader.read() == b""  # closed by the release
        await tunnel_logged.wait()  # the tunnel's record is written as its task ends
    writer.close()
    (record,) = [e for e in scene.events if e.get("method") == "CONNECT"]
    assert record["end"] == "released"

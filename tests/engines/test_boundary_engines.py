"""`prepare_execution` on real docker and podman containers, cut through a helper container.

The proxy (this process) listens on the container's bridge gateway, found by the runtime's
`inspect`; the cut, probe and status run in helper containers; the agent is busybox `wget`
run in the container with `docker|podman exec`, so nothing in the test enters the namespace
either (docs/user-guide.md#helper-mode). A second 198.19 host is an address on a dummy link
in the root namespace (198.19.254.0/24, outside the engines' bridges), reachable from the
container before the cut through its gateway and not after. The origin is a test host in
198.18.0.0/17 that only the proxy reaches.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from aiohttp import web
from enginelib import Box, sh

from egress import (
    EgressProxy,
    ExecutionNotReady,
    Policy,
    build_settings,
    prepare_execution,
    release_execution,
)
from netcut import api
from netcut import resolve as target

import harness
from servers import run, start_origin

pytestmark = pytest.mark.netns
ENGINES = [pytest.param(e, marks=pytest.mark.engine(e)) for e in ("docker", "podman")]


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"direct"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return


@contextmanager
def http_server(addr: str) -> Iterator[int]:
    """A plain HTTP server on `addr` in the root namespace (answers `direct`); its port.

    Its accept waits at most a second: `serve_forever` accepts on a blocking socket once poll
    says it is readable, and an accept that then found nothing blocked the thread for good, so
    that `shutdown()` hung the test's teardown until pytest-timeout (seen once on containerd at
    load 17). Now such an accept times out, `serve_forever` polls on, and teardown ends."""
    srv = ThreadingHTTPServer((addr, 0), _Hello)
    srv.socket.settimeout(1.0)  # the served connections are blocking (socket.accept)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()


_other_links = itertools.count(1)
# 198.19.254.248/30 is tests/integration/test_harness.py's; the rest of the /24 is ours
OTHER_HOSTS = [f"198.19.254.{n}" for n in range(1, 248)]


@contextmanager
def other_host() -> Iterator[str]:
    """Another 198.19 address on this machine: one end of a veth pair in the root namespace
    (named with the pid and a counter, removed whatever happens).

    The address is one no interface holds yet, chosen and added under a machine-wide lock:
    it used to be derived from the pid alone, so two runs at once (two checkouts' suites)
    could hold the same address on two links, and the first to end took the other's away."""
    pid = os.getpid()
    link = f"ncbh{pid % 100000}x{next(_other_links)}"
    sh("ip", "link", "add", link, "type", "veth", "peer", "name", f"{link}p")
    try:
        with open("/run/egress-test-other-host.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when closed
            held = set(re.findall(r"inet ([\d.]+)/", sh("ip", "-o", "-4", "addr", "show").stdout))
            start = pid % len(OTHER_HOSTS)
            addr = next(
                a for a in OTHER_HOSTS[start:] + OTHER_HOSTS[:start] if a not in held
            )  # StopIteration: 247 at once, never
            sh("ip", "addr", "add", f"{addr}/32", "dev", link)
        sh("ip", "link", "set", link, "up")
        sh("ip", "link", "set", f"{link}p", "up")
        yield addr
    finally:
        sh("ip", "link", "del", link, check=False)


@contextmanager
def no_setns(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """While open, entering a namespace from this process fails the test: egress's setns
    (listeners, addresses, gateway) and netcut's direct worker are replaced by a refusal."""

    def refuse(*args: object, **kwargs: object) -> object:
        raise AssertionError(f"helper mode entered a namespace: {args!r}")

    with monkeypatch.context() as m:
        m.setattr("egress.proxy.net.netns._libc", refuse)
        m.setattr("egress.proxy.net.netns.namespace_path", refuse)
        m.setattr("netcut.api.run_in_netns", refuse)
        yield


async def wget_in(box: Box, url: str, proxy: str | None = None) -> tuple[int, str, str]:
    """busybox wget in the container (the agent), with `http_proxy` when given."""
    env = ["-e", f"http_proxy={proxy}"] if proxy else []
    return await run(
        "timeout", "20", box.engine, "exec", *env, box.name, "busybox", "wget", "-q", "-O", "-", url
    )


@pytest.mark.parametrize("engine", ENGINES)
async def test_prepare_execution_in_helper_mode(
    engine: str,
    make_box: Callable[..., Box],
    test_host: harness.TestHost,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    box = make_box(engine)
    routes = box.routes()
    origin = await start_origin(test_host, 80)

    async def model(request: web.Request) -> web.Response:
        return web.json_response({"model": "ok", "path": request.path})

    app = web.Application()
    app.router.add_get("/{tail:.*}", model)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    route = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    pins = [f"pypi.test={test_host.addr_ns}", f"evil.test={test_host.addr_ns}"]
    settings = build_settings({}, resolve=pins)
    records: list[dict[str, object]] = []
    try:
        async with EgressProxy(settings, listen=["127.0.0.1:0"]) as proxy:
            proxy.hooks.append(records.append)
            with (
                other_host() as other,
                http_server(other) as other_port,
                http_server(box.gateway) as side_port,
            ):
                direct = [f"http://{other}:{other_port}/", f"http://{box.gateway}:{side_port}/"]
                for url in direct:  # reachable before the cut: the refusals below mean it
                    rc, out, err = await wget_in(box, url)
                    assert (rc, out) == (0, "direct"), err
                with no_setns(monkeypatch):
                    execution = await prepare_execution(
                        f"{engine}:{box.name}",
                        Policy(allow=["pypi.test"], block=["evil.test"]),
                        proxy,
                        mode="gateway",
                        cut_mode="helper",
                        proxy_port=0,
                        framework_routes=[route],
                        expect_blocked=[f"{other}:{other_port}", f"{box.gateway}:{side_port}"],
                    )
                assert execution.cut_mode == "helper"
                assert execution.client_id == f"{engine}-{box.name[:12]}"
                assert execution.probe is not None
                assert execution.probe.ok
                assert f"@{box.gateway}:" in execution.proxy_url
                assert "default" not in box.routes()
                cid, proxy_env = execution.client_id, execution.env["http_proxy"]

                rc, out, err = await wget_in(box, "http://pypi.test/simple/", proxy_env)
                assert rc == 0, err
                assert '"path": "/simple/"' in out
                rc, out, err = await wget_in(box, "http://evil.test/", proxy_env)
                assert rc != 0
                assert "403" in err, (out, err)
                rc, out, err = await wget_in(box, execution.framework_urls[route] + "/models")
                assert rc == 0, err
                assert '"path": "/v1/models"' in out
                for url in direct:
                    rc, out, _ = await wget_in(box, url)
                    assert rc != 0, url
                    assert out != "direct"

                mine = [r for r in records if r.get("client_id") == cid]
                assert {(r["host"], r["decision"], r["reason"]) for r in mine} >= {
                    ("pypi.test", "allow", "allow_rule"),
                    ("evil.test", "block", "block_rule"),
                }
                with no_setns(monkeypatch):
                    summary = await release_execution(proxy, execution, restore=True)
                assert summary.by_host["pypi.test"] == {"allow": 1}
                assert "evil.test" in summary.blocked_hosts
                assert box.routes_back_to(routes) == routes
                assert api.status(target.container(box.name, engine)).state == "not cut"
                rc, out, err = await wget_in(box, direct[0])
                assert (rc, out) == (0, "direct"), err
        assert [s.path for s in origin.seen] == ["/simple/"]
    finally:
        await runner.cleanup()
        await origin.close()


@pytest.mark.engine("docker")
async def test_a_helper_cut_is_released_by_a_direct_restore(
    make_box: Callable[..., Box],
) -> None:
    """Records are keyed by the namespace: a host that can enter it restores a helper cut."""
    box = make_box("docker")
    routes = box.routes()
    async with EgressProxy(build_settings({}), listen=["127.0.0.1:0"]) as proxy:
        execution = await prepare_execution(
            f"docker:{box.name}",
            Policy(),
            proxy,
            mode="gateway",
            cut_mode="helper",
            proxy_port=0,
            socks_port=0,
        )
        assert api.status(target.container(box.name, "docker")).is_cut
        socks = execution.listeners[-1]
        assert socks.kind == "socks5"
        assert socks.host == box.gateway
        assert f"{socks.host}:{socks.port}" in {str(k) for k in execution.cut.plan.keeps}
        assert f"{socks.host}:{socks.port}" in {i.target for i in execution.probe.items}
        await release_execution(proxy, execution, restore=True, cut_mode="direct")
    assert box.routes_back_to(routes) == routes
    assert api.status(target.container(box.name, "docker")).state == "not cut"


@pytest.mark.parametrize("engine", ENGINES)
async def test_helper_mode_fails_closed(engine: str, make_box: Callable[..., Box]) -> None:
    """As in direct mode: a probe that cannot be proven hands nothing out and leaves the cut
    in place; a container holding NET_RAW is refused before anything is cut."""
    box = make_box(engine)
    routes = box.routes()
    ref = target.container(box.name, engine)
    async with EgressProxy(build_settings({}), listen=[f"{box.gateway}:0"]) as proxy:
        port = proxy.addresses[0][1]
        with pytest.raises(ExecutionNotReady, match="probe failed"):
            await prepare_execution(
                f"{engine}:{box.name}",
                Policy(),
                proxy,
                mode="gateway",
                cut_mode="helper",
                proxy_port=port,
                expect_blocked=[f"{box.gateway}:{port}"],  # the proxy answers
            )
        assert api.status(ref).is_cut
        assert not proxy.clients.spec(f"{engine}-{box.name[:12]}")
        api.restore(ref)
        assert box.routes_back_to(routes) == routes

        rawbox = make_box(engine, drop_all=False)
        raw_routes = rawbox.routes()
        with pytest.raises(ExecutionNotReady, match="NET_RAW"):
            await prepare_execution(
                f"{engine}:{rawbox.name}",
                Policy(),
                proxy,
                mode="gateway",
                cut_mode="helper",
                proxy_port=port,
            )
        assert rawbox.routes_back_to(raw_routes) == raw_routes

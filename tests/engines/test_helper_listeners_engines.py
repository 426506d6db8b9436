"""Loopback listeners from the helper on real engines, asked for explicitly
(`cut_mode="helper"`), from this (root) process: root podman and docker, a port taken inside
the sandbox, and a re-prepare that reuses the passed listeners. The same path as a
docker-group user is test_unprivileged_engines.py; here it is what root podman users get
when they ask for the helper (docs/user-guide.md#helper-mode)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable

import pytest
from enginelib import Box, sh
from test_boundary_engines import http_server, other_host, wget_in

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
from servers import start_origin

pytestmark = pytest.mark.netns
ENGINES = [pytest.param(e, marks=pytest.mark.engine(e)) for e in ("docker", "podman")]


@pytest.mark.parametrize("engine", ENGINES)
async def test_loopback_listeners_from_the_helper(
    engine: str, make_box: Callable[..., Box], test_host: harness.TestHost
) -> None:
    box = make_box(engine)
    routes = box.routes()
    origin = await start_origin(test_host, 80)
    pins = [f"pypi.test={test_host.addr_ns}", f"evil.test={test_host.addr_ns}"]
    try:
        async with EgressProxy(build_settings({}, resolve=pins), listen=()) as proxy:
            with other_host() as other, http_server(other) as port:
                direct = f"http://{other}:{port}/"
                assert (await wget_in(box, direct))[:2] == (0, "direct")
                execution = await prepare_execution(
                    f"{engine}:{box.name}",
                    Policy(allow=["pypi.test"]),
                    proxy,
                    cut_mode="helper",
                    expect_blocked=[f"{other}:{port}"],
                )
                assert execution.cut_mode == "helper"
                assert execution.cut_mode_reason == "cut_mode='helper' was asked for"
                assert [li.netns for li in execution.listeners] == [f"/proc/{box.pid}/ns/net"]
                proxy_url = execution.env["http_proxy"]
                assert proxy_url.endswith("@127.0.0.1:3128")
                rc, _, err = await wget_in(box, "http://pypi.test/a", proxy_url)
                assert rc == 0, err
                rc, _, err = await wget_in(box, "http://evil.test/", proxy_url)
                assert "403" in err
                assert (await wget_in(box, direct))[0] != 0

                # prepared again: the listener is reused (no socket asked of a helper), the
                # cut found in place, the new policy in force at once
                again = await prepare_execution(
                    f"{engine}:{box.name}",
                    Policy(allow=["pypi.test", "evil.test"]),
                    proxy,
                    cut_mode="helper",
                )
                assert again.listeners[0] is execution.listeners[0]
                rc, _, err = await wget_in(box, "http://evil.test/b", proxy_url)
                assert rc == 0, err

                await release_execution(proxy, again, restore=True)
                assert not proxy.listeners
                assert box.routes_back_to(routes) == routes
                assert (await wget_in(box, direct))[:2] == (0, "direct")
        assert [s.path for s in origin.seen] == ["/a", "/b"]
    finally:
        await origin.close()


@pytest.mark.engine("docker")
async def test_a_port_taken_inside_the_sandbox_fails_closed(
    make_box: Callable[..., Box],
) -> None:
    """The helper's bind fails with EADDRINUSE: `port_in_use`, nothing cut, nothing held."""
    box = make_box("docker")
    routes = box.routes()
    sh("docker", "exec", box.name, "busybox", "httpd", "-p", "127.0.0.1:3128")  # daemonizes
    async with EgressProxy(build_settings({}), listen=()) as proxy:
        held = sh("docker", "exec", box.name, "busybox", "netstat", "-ltn").stdout
        assert "127.0.0.1:3128" in held  # httpd binds before it daemonizes
        with pytest.raises(ExecutionNotReady) as caught:
            await prepare_execution(f"docker:{box.name}", Policy(), proxy, cut_mode="helper")
        assert caught.value.kind == "port_in_use", caught.value
        assert "127.0.0.1:3128" in str(caught.value)
        assert not proxy.listeners
    assert box.routes() == routes
    assert api.status(target.container(box.name, "docker")).state == "not cut"


@pytest.mark.engine("docker")
def test_netcut_cli_transparent_cut_in_helper_mode(make_box: Callable[..., Box]) -> None:
    """`netcut cut --mode helper --transparent`: the helper writes the nat redirects, status
    verifies them (a redirect chain removed by hand is `partial`), restore removes them. It
    used to be refused as a usage error."""
    box = make_box("docker")
    routes = box.routes()
    netcut = [os.path.join(os.path.dirname(sys.executable), "netcut")]
    where = ["--container", box.name, "--runtime", "docker", "--mode", "helper"]
    redirect = ["--transparent", "--redirect-to", "15001", "--dns-to", "15053"]
    done = sh(*netcut, "cut", *where, *redirect, "--json", check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["status"]["state"] == "cut"
    nat = sh("nsenter", f"--net={box.netns}", "iptables-legacy", "-t", "nat", "-S").stdout
    assert "-A NETCUT_REDIRECT -p tcp -j REDIRECT --to-ports 15001" in nat, nat
    said = json.loads(sh(*netcut, "status", *where, "--json", check=False).stdout)
    assert said["state"] == "cut", said
    sh("nsenter", f"--net={box.netns}", "iptables-legacy", "-t", "nat", "-F", "NETCUT_REDIRECT")
    sh("nsenter", f"--net={box.netns}", "iptables-legacy", "-t", "nat", "-D", "OUTPUT",
       "-j", "NETCUT_REDIRECT")  # fmt: skip
    sh("nsenter", f"--net={box.netns}", "iptables-legacy", "-t", "nat", "-X", "NETCUT_REDIRECT")
    said = json.loads(sh(*netcut, "status", *where, "--json", check=False).stdout)
    assert said["state"] == "partial", said
    done = sh(*netcut, "restore", *where, "--json", check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert box.routes_back_to(routes) == routes
    assert (
        "NETCUT_REDIRECT"
        not in sh("nsenter", f"--net={box.netns}", "iptables-legacy", "-t", "nat", "-S").stdout
    )

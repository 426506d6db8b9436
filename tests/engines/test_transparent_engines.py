"""Transparent mode on real docker and podman containers, cut directly (this process is root).

The agent is busybox in the container, run with `docker|podman exec` and no proxy variables:
its `wget` resolves names through whatever the container's resolv.conf names (docker's
embedded DNS at 127.0.0.11 on a user network), and the cut's redirect hands every query to
the in-namespace DNS responder and every TCP connection to the transparent listener
(docs/proxy.md#transparent-mode-and-socks5, docs/netcut.md#transparent-mode): the cut's
REDIRECT wins over docker's own DNAT of 127.0.0.11:53, so a name the embedded DNS would have
answered (the container's) is judged by the policy instead. The allowed
upstream is a test host in 198.18.0.0/17 that only the proxy reaches; a second 198.19 host
(a veth end in the root namespace) is reachable from the container before the cut, so its
refusal after the cut means something.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable

import pytest
from enginelib import CTR_NAMESPACE, Box, sh
from test_boundary_engines import http_server, other_host

from egress import EgressProxy, Policy, build_settings, prepare_execution, release_execution
from netcut import api
from netcut import resolve as target

import harness
from proxykit import MemoryAudit
from servers import run, start_origin

pytestmark = pytest.mark.netns
ENGINES = [pytest.param(e, marks=pytest.mark.engine(e)) for e in ("docker", "podman", "containerd")]
_exec_ids = itertools.count(1)


async def busybox(box: Box, *argv: str) -> tuple[int, str, str]:
    """A busybox applet in the container (the agent): the container's own environment, so no
    proxy variable at all."""
    if box.engine == "containerd":
        exec_id = f"nc-x{os.getpid()}-{next(_exec_ids)}"
        enter = ["ctr", "-n", CTR_NAMESPACE, "tasks", "exec", "--exec-id", exec_id, box.name]
    else:
        enter = [box.engine, "exec", box.name]
    return await run("timeout", "20", *enter, "busybox", *argv)


def nat_table(box: Box) -> str:
    return sh(*nsenter(box), "iptables-legacy-save", "-t", "nat").stdout


async def docker_dnat_first(box: Box, audit: MemoryAudit) -> None:
    """Should Docker's DNAT of 127.0.0.11:53 run first (its nft chain registered after the
    cut's nat table: the kernel runs the later one first), the query reaches neither dockerd
    nor the responder: the backstop rejects the embedded DNS's address after NAT (fail
    closed, docs/netcut.md#the-plan)."""
    assert embedded_dns_rejects(box) == 0  # so far every query went to the responder
    asked = len(audit.find(method="DNS", host="allowed.test"))
    nft = [*nsenter(box), "iptables-nft", "-t", "nat"]
    sh(*nft, "-F", "OUTPUT")
    sh(*nft, "-X", "OUTPUT")  # the base chain goes, and comes back as the newest nat hook
    sh(*nft, "-A", "OUTPUT", "-d", "127.0.0.11/32", "-j", "DOCKER_OUTPUT")
    rc, out, err = await busybox(box, "wget", "-q", "-O", "-", "http://allowed.test/again")
    assert rc != 0, out
    assert "bad address" in err, err
    assert len(audit.find(method="DNS", host="allowed.test")) == asked
    assert embedded_dns_rejects(box) > 0  # the DNAT did run first


def embedded_dns_rejects(box: Box) -> int:
    """Packets the backstop's `-d 127.0.0.11/32 -j REJECT` refused."""
    saved = sh(*nsenter(box), "iptables-legacy-save", "-c", "-t", "filter").stdout
    line = next(li for li in saved.splitlines() if "-d 127.0.0.11/32 -j REJECT" in li)
    return int(line[1 : line.index(":")])


def nsenter(box: Box) -> list[str]:
    return ["nsenter", f"--net={box.netns}"]


@pytest.mark.parametrize("engine", ENGINES)
async def test_transparent_mode_in_a_container(
    engine: str, make_box: Callable[..., Box], test_host: harness.TestHost
) -> None:
    box = make_box(engine)
    routes = box.routes()
    _, resolv, _ = await busybox(box, "cat", "/etc/resolv.conf")
    if engine == "docker":  # a user network: docker's embedded DNS, which answers names
        assert "nameserver 127.0.0.11" in resolv, resolv  # of containers itself
        rc, out, err = await busybox(box, "nslookup", box.name)
        assert rc == 0, (out, err)
        assert box.ip in out
    origin = await start_origin(test_host, 80)
    up = test_host.addr_ns
    audit = MemoryAudit()
    settings = build_settings({}, resolve=[f"allowed.test={up}", f"evil.test={up}"])
    proxy = EgressProxy(settings, audit=audit)
    await proxy.start()
    try:
        with other_host() as other, http_server(other) as other_port:
            direct = f"http://{other}:{other_port}/"
            rc, out, err = await busybox(box, "wget", "-q", "-O", "-", direct)
            assert (rc, out) == (0, "direct"), err  # reachable before the cut
            execution = await prepare_execution(
                f"{engine}:{box.name}",
                Policy(allow=["allowed.test"], block=["evil.test"]),
                proxy,
                transparent=True,
            )
            assert execution.cut_mode == "direct"
            assert "NETCUT_REDIRECT" in nat_table(box)
            cid = execution.client_id

            # an allowed name: resolved by the responder to a fake address, relayed, audited
            rc, out, err = await busybox(box, "wget", "-q", "-O", "-", "http://allowed.test/hi")
            assert rc == 0, (out, err)
            assert json.loads(out)["path"] == "/hi"
            lookup = await audit.wait_for(method="DNS", host="allowed.test", qtype="A")
            assert (lookup["decision"], lookup["mode"]) == ("allow", "transparent")
            if engine == "docker":
                # the embedded DNS knew the container's own name; the responder, which now
                # gets the query, judges it: not allowed, so NXDOMAIN
                rc, out, err = await busybox(box, "nslookup", box.name)
                assert rc != 0, out
                assert box.ip not in out
                own = await audit.wait_for(method="DNS", host=box.name, qtype="A")
                assert (own["decision"], own["rcode"]) == ("block", "NXDOMAIN")
            event = await audit.wait_for(method="GET", host="allowed.test", path="/hi")
            assert (event["decision"], event["mode"], event["status"]) == (
                "allow",
                "transparent",
                200,
            )
            assert (event["addr"], event["client_id"]) == (up, cid)
            assert event["orig_dst"] == f"{lookup['answer']}:80"

            # a blocked name does not resolve: NXDOMAIN, audited; nothing reaches the origin
            rc, out, err = await busybox(box, "wget", "-q", "-O", "-", "http://evil.test/")
            assert rc != 0, out
            lookup = await audit.wait_for(method="DNS", host="evil.test", qtype="A")
            assert (lookup["decision"], lookup["rcode"], lookup["rule"]) == (
                "block",
                "NXDOMAIN",
                "evil.test",
            )
            assert not audit.find(method="GET", host="evil.test")

            # an address literal no rule allows: redirected, judged as the address, reset
            rc, out, _ = await busybox(box, "wget", "-q", "-O", "-", direct)
            assert rc != 0
            assert out != "direct"
            event = await audit.wait_for(host=other, port=other_port)
            assert (event["decision"], event["mode"], event["end"]) == (
                "block",
                "transparent",
                "reset",
            )
            assert event["orig_dst"] == f"{other}:{other_port}"
            assert "addr" not in event

            # UDP other than DNS: rejected by the backstop at send (EPERM)
            rc, out, err = await busybox(
                box, "tftp", "-g", "-r", "x", "-l", "/tmp/x", other, "9999"
            )
            assert rc != 0, (out, err)
            assert "not permitted" in err, (out, err)

            if engine == "docker":
                await docker_dnat_first(box, audit)

            summary = await release_execution(proxy, execution, restore=True)
            assert summary.by_host["allowed.test"] == {"allow": 1}
            assert "NETCUT_REDIRECT" not in nat_table(box)
            assert api.status(target.container(box.name, engine)).state == "not cut"
            assert box.routes_back_to(routes) == routes
            rc, out, err = await busybox(box, "wget", "-q", "-O", "-", direct)
            assert (rc, out) == (0, "direct"), err
            if engine == "docker":  # the embedded DNS answers again
                rc, out, err = await busybox(box, "nslookup", box.name)
                assert (rc, box.ip in out) == (0, True), (out, err)
        assert [s.path for s in origin.seen] == ["/hi"]
    finally:
        await proxy.stop()
        await origin.close()

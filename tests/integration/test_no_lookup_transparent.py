"""No lookup decides nothing in transparent mode and from the DNS responder (issue 32).

Before: with any allow address rule, the responder gave *every* name a fake address, and the
connection to it made the proxy resolve the name; a TLS SNI or an HTTP Host naming something
else on an allowed address was resolved too. Now a name no rule can allow is NXDOMAIN at the
responder and refused at the connection, with no query.

A sandbox is cut with `transparent=True` (its DNS goes to the responder, its TCP to the
proxy); the proxy's resolver sends real A and AAAA queries over UDP to `QueryLog`, our DNS
server on a 198.18.0.0/15 address, which records every query it receives (`getaddrinfo`
cannot be pointed at it from inside this process; `test_no_lookup_resolver.py` runs `egress serve`
with glibc's resolver for the other front-ends).
"""

from __future__ import annotations

import asyncio
import shutil
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import dns.message
import dns.query
import dns.rdatatype
import pytest

from egress import EgressProxy, Policy, build_settings, prepare_execution, release_execution
from egress.boundary import Execution
from egress.proxy.net.resolve import Resolver

import harness
from dnslog import QueryLog
from proxykit import MemoryAudit
from servers import Origin, run, start_origin

pytestmark = pytest.mark.netns

EVIL = "evil.test"
AGENT = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all",
         "--bounding-set=-all", "--"]  # fmt: skip


def udp_lookup(server: str) -> object:
    """A resolver function asking `server` (A and AAAA, as getaddrinfo does) over UDP."""

    def lookup(host: str) -> list[str]:
        found: list[str] = []
        for rdtype in (dns.rdatatype.A, dns.rdatatype.AAAA):
            answer = dns.query.udp(dns.message.make_query(host, rdtype), server, timeout=2)
            found += [r.to_text() for rrset in answer.answer for r in rrset]
        if not found:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return found

    return lookup


@dataclass
class Scene:
    sandbox: harness.TestHost
    upstream: harness.TestHost
    origin: Origin
    log: QueryLog
    audit: MemoryAudit
    execution: Execution


@pytest.fixture
async def scene(test_host_factory: object) -> AsyncIterator[Scene]:
    sandbox = test_host_factory()  # type: ignore[operator]
    upstream = test_host_factory()  # type: ignore[operator]
    up = upstream.addr_ns
    origin = await start_origin(upstream, 80)
    log = QueryLog({"www.test": up})
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_datagram_endpoint(
        lambda: log, local_addr=(upstream.addr_root, 53)
    )
    etc = Path("/etc/netns") / sandbox.ns
    etc.mkdir(parents=True)
    (etc / "resolv.conf").write_text(f"nameserver {up}\noptions attempts:1 timeout:3\n")
    audit = MemoryAudit()
    resolver = Resolver(lookup=udp_lookup(upstream.addr_root))  # type: ignore[arg-type]
    proxy = EgressProxy(build_settings({}), audit=audit, resolver=resolver)
    await proxy.start()
    # an allowed name, and an address rule on the upstream's address (ports 80 and 443)
    policy = Policy(allow=["www.test", up])
    try:
        execution = await prepare_execution(sandbox.ns, policy, proxy, transparent=True)
        yield Scene(sandbox, upstream, origin, log, audit, execution)
        await release_execution(proxy, execution, restore=True)
    finally:
        await proxy.stop()
        transport.close()
        await origin.close()
        shutil.rmtree(etc, ignore_errors=True)


async def agent(scene: Scene, *argv: str) -> tuple[int, str, str]:
    return await run("ip", "netns", "exec", scene.sandbox.ns, "env", "-i", "PATH=/usr/bin:/bin",
                     *AGENT, *argv)  # fmt: skip


async def test_refused_names_cost_no_query_in_transparent_mode(scene: Scene) -> None:
    up = scene.upstream.addr_ns
    curl = ["curl", "-sS", "--noproxy", "*", "--max-time", "10"]
    # the DNS responder: a name no rule can allow is NXDOMAIN (before: a fake address)
    rc, out, err = await agent(scene, "getent", "ahostsv4", f"responder.{EVIL}")
    assert rc == 2, (rc, out, err)  # not found
    lookup = await scene.audit.wait_for(method="DNS", host=f"responder.{EVIL}", qtype="A")
    assert (lookup["decision"], lookup["reason"], lookup["rcode"]) == (
        "block",
        "default_deny",
        "NXDOMAIN",
    )
    # ... so a client cannot reach the name through a fake address
    rc, _, err = await agent(scene, *curl, f"http://fake.{EVIL}/")
    assert rc == 6, err  # could not resolve host
    # a TLS SNI naming something else on an allowed address: refused (reset) by its name
    rc, _, err = await agent(scene, *curl, "-k", "--resolve", f"sni.{EVIL}:443:{up}",
                             f"https://sni.{EVIL}/")  # fmt: skip
    assert rc != 0, err
    event = await scene.audit.wait_for(host=f"sni.{EVIL}", port=443)
    assert (event["decision"], event["reason"], event["end"]) == ("block", "default_deny", "reset")
    # an HTTP Host naming something else on an allowed address: 403 by its name
    rc, out, err = await agent(scene, *curl, "-i", "--resolve", f"host.{EVIL}:80:{up}",
                               f"http://host.{EVIL}/")  # fmt: skip
    assert " 403 " in out.splitlines()[0], (out, err)
    event = await scene.audit.wait_for(method="GET", host=f"host.{EVIL}")
    assert (event["decision"], event["reason"]) == ("block", "default_deny")
    # the allowed name still resolves (through our server) and is served; the address too
    rc, out, err = await agent(scene, *curl, "http://www.test/hello")
    assert rc == 0, err
    assert '"/hello"' in out
    rc, out, err = await agent(scene, *curl, f"http://{up}/direct")
    assert rc == 0, err
    assert '"/direct"' in out
    assert ("www.test", "A") in scene.log.asked, scene.log.asked
    leaked = sorted(n for n in scene.log.names() if n.endswith(EVIL))
    assert leaked == [], f"refused names were resolved: {leaked}"

"""The DNS responder on a sandbox's own loopback, asked by real clients: glibc's stub resolver
(getent, through the namespace's resolv.conf) over UDP and dnspython over TCP and UDP. The
dnspython cases need no namespace: their responder listens on this namespace's loopback, at
an ephemeral port."""

from __future__ import annotations

import ipaddress
import shutil
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from egress.policy.rules import Policy
from egress.proxy.codec.dns import FakeIPs
from egress.proxy.core.clients import Identity
from egress.proxy.modes.dns import open_dns
from egress.proxy.net.listener import Listener
from egress.proxy.server import EgressProxy

import harness
from proxykit import MemoryAudit
from servers import run

POLICY = Policy(allow=["*.allowed.test", "git.test:22"], block=["bad.allowed.test"])


@pytest.fixture
async def loop_responder() -> AsyncIterator[tuple[EgressProxy, Listener, MemoryAudit]]:
    """The responder on 127.0.0.1 at an ephemeral port of this namespace (no root)."""
    audit = MemoryAudit()
    proxy = EgressProxy(Policy(), audit=audit)
    await proxy.start()
    try:
        listener = await open_dns(proxy, "127.0.0.1:0", identity=Identity("sb", POLICY),
                                  fake_ips=FakeIPs())  # fmt: skip
        yield proxy, listener, audit
    finally:
        await proxy.stop()


@pytest.fixture
def resolv_conf(test_host: harness.TestHost) -> Iterator[harness.TestHost]:
    """`ip netns exec` bind-mounts /etc/netns/NS/resolv.conf over /etc/resolv.conf."""
    d = Path("/etc/netns") / test_host.ns
    d.mkdir(parents=True)
    (d / "resolv.conf").write_text("nameserver 127.0.0.1\noptions attempts:1 timeout:2\n")
    try:
        yield test_host
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
async def responder(
    resolv_conf: harness.TestHost,
) -> AsyncIterator[tuple[EgressProxy, Listener, MemoryAudit]]:
    audit = MemoryAudit()
    proxy = EgressProxy(Policy(), audit=audit)
    await proxy.start()
    try:
        host = resolv_conf
        await run("ip", "-n", host.ns, "link", "set", "lo", "up")
        listener = await open_dns(proxy, "127.0.0.1:53", netns=host.ns,
                                  identity=Identity("sb", POLICY), fake_ips=FakeIPs())  # fmt: skip
        yield proxy, listener, audit
    finally:
        await proxy.stop()


@pytest.mark.netns
async def test_stub_resolver_gets_fake_address_or_nxdomain(
    resolv_conf: harness.TestHost, responder: tuple[EgressProxy, Listener, MemoryAudit]
) -> None:
    proxy, listener, audit = responder
    rc, out, err = await run("ip", "netns", "exec", resolv_conf.ns, "getent", "ahostsv4",
                             "www.allowed.test")  # fmt: skip
    assert rc == 0, err
    addr = ipaddress.IPv4Address(out.split()[0])
    assert addr in ipaddress.IPv4Network("198.19.128.0/17")
    assert listener.fake_ips is not None
    assert listener.fake_ips.name_for(addr) == "www.allowed.test"
    assert proxy.guard.classify(addr) == "reserved_extra"  # the proxy never dials the pool
    event = await audit.wait_for(host="www.allowed.test", qtype="A")
    assert (event["decision"], event["rule"], event["answer"]) == ("allow", "*.allowed.test",
                                                                   str(addr))  # fmt: skip
    assert (event["method"], event["mode"], event["transport"]) == ("DNS", "transparent", "udp")

    rc, out, _ = await run("ip", "netns", "exec", resolv_conf.ns, "getent", "ahostsv4",
                           "bad.allowed.test")  # fmt: skip
    assert rc == 2  # getent: key not found
    assert out == ""
    event = await audit.wait_for(host="bad.allowed.test", qtype="A")
    assert (event["decision"], event["reason"], event["rcode"]) == ("block", "block_rule",
                                                                    "NXDOMAIN")  # fmt: skip
    assert event["rule"] == "bad.allowed.test"


async def test_tcp_queries_pipelined(
    loop_responder: tuple[EgressProxy, Listener, MemoryAudit],
) -> None:
    _proxy, listener, audit = loop_responder
    script = (
        "import dns.message, dns.query\n"
        "for name in ('git.test', 'evil.test'):\n"
        "    r = dns.query.tcp(dns.message.make_query(name, 'A'), '127.0.0.1', timeout=5,\n"
        f"                      port={listener.port})\n"
        "    print(name, dns.rcode.to_text(r.rcode()), [rr.to_text() for rr in r.answer])\n"
    )
    rc, out, err = await run(sys.executable, "-c", script)
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("git.test NOERROR ['git.test. 30 IN A 198.19.128.")
    assert lines[1] == "evil.test NXDOMAIN []"
    event = await audit.wait_for(host="evil.test")
    assert (event["transport"], event["reason"]) == ("tcp", "default_deny")


async def test_refused_when_the_audit_log_cannot_be_written(
    loop_responder: tuple[EgressProxy, Listener, MemoryAudit],
) -> None:
    _proxy, listener, audit = loop_responder
    audit.accepting = False
    script = (
        "import dns.message, dns.query, dns.rcode\n"
        "r = dns.query.udp(dns.message.make_query('www.allowed.test', 'A'), '127.0.0.1', "
        f"timeout=5, port={listener.port})\n"
        "print(dns.rcode.to_text(r.rcode()), len(r.answer))\n"
    )
    rc, out, err = await run(sys.executable, "-c", script)
    assert rc == 0, err
    assert out.strip() == "REFUSED 0"


@pytest.mark.netns
async def test_dns_records_are_counted_in_the_metrics(
    resolv_conf: harness.TestHost, responder: tuple[EgressProxy, Listener, MemoryAudit]
) -> None:
    """Issue 19 item 9: DNS records were written to the audit log but missing from the
    metrics; now every one is counted (docs/metrics.md)."""
    proxy, _listener, audit = responder
    for name in ("www.allowed.test", "bad.allowed.test"):
        await run("ip", "netns", "exec", resolv_conf.ns, "getent", "ahostsv4", name)
    await audit.wait_for(host="bad.allowed.test", qtype="A")
    dns_records = [e for e in audit.events if e.get("method") == "DNS"]
    rows: list[dict[str, object]] = proxy.metrics()["dns_queries"]  # type: ignore[assignment]
    assert sum(int(r["count"]) for r in rows) == len(dns_records)  # type: ignore[call-overload]
    seen = {(r["client_id"], r["decision"]) for r in rows}
    assert seen >= {("sb", "allow"), ("sb", "block")}

"""Transparent mode end to end in real namespaces: a sandbox cut with `transparent=True`, its
tools run with no proxy variables (Node's fetch, curl --noproxy '*', a raw Python client),
each allowed and blocked case checked in the audit log, DNS lookups included; UDP other than
DNS dropped; the red-team cases of CONNECT refused here too; restore removes the redirects."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from egress import EgressProxy, Policy, build_settings, prepare_execution, release_execution
from egress.boundary import Execution
from egress.proxy.net.netns import listen_in_netns

import harness
from proxykit import MemoryAudit
from servers import Origin, run, start_origin, start_tcp

pytestmark = pytest.mark.netns

AGENT = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all",
         "--bounding-set=-all", "--"]  # fmt: skip
POLICY = Policy(
    allow=["www.test", "git.test:22", "tls.test", "rebind.test", "0x7f.1", "socks.test:80"],
    block=["evil.test"],
)


async def ssh_like(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Server speaks first (a banner), then answers each line reversed."""
    try:
        writer.write(b"SSH-2.0-egress-test\r\n")
        await writer.drain()
        while line := await reader.readline():
            writer.write(line.rstrip(b"\n")[::-1] + b"\n")
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


@dataclass
class Scene:
    sandbox: harness.TestHost
    upstream: harness.TestHost
    origin: Origin
    proxy: EgressProxy
    audit: MemoryAudit
    execution: Execution


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    d = tmp_path_factory.mktemp("transparent-tls")
    key, crt = str(d / "key.pem"), str(d / "crt.pem")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", key, "-out", crt, "-days", "2", "-subj", "/CN=tls.test",
         "-addext", "subjectAltName=DNS:tls.test,DNS:evil.test"],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    return crt, key


@pytest.fixture
async def scene(test_host_factory: object, cert: tuple[str, str]) -> AsyncIterator[Scene]:
    import ssl

    sandbox = test_host_factory()  # type: ignore[operator]
    upstream = test_host_factory()  # type: ignore[operator]
    up = upstream.addr_ns
    origin = await start_origin(upstream, 80)
    ssh_srv = await start_tcp(upstream, 22, ssh_like)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(*cert)

    async def tls_echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(b"tls-echo:" + await reader.read(100))
            await writer.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    tls_srv = await asyncio.start_server(tls_echo, sock=listen_in_netns(upstream.ns, up, 443),
                                         ssl=ctx)  # fmt: skip
    # "whatever resolv.conf says": a nameserver the sandbox could never reach after the cut
    etc = Path("/etc/netns") / sandbox.ns
    etc.mkdir(parents=True)
    (etc / "resolv.conf").write_text(f"nameserver {up}\noptions attempts:1 timeout:3\n")
    audit = MemoryAudit()
    pins = [f"{n}={up}" for n in ("www.test", "git.test", "tls.test", "evil.test", "socks.test")]
    settings = build_settings({}, resolve=[*pins, "rebind.test=127.0.0.1"])
    proxy = EgressProxy(settings, audit=audit)
    await proxy.start()
    try:
        execution = await prepare_execution(sandbox.ns, POLICY, proxy, transparent=True,
                                            socks_port=1080)  # fmt: skip
        yield Scene(sandbox, upstream, origin, proxy, audit, execution)
        await release_execution(proxy, execution, restore=True)
    finally:
        await proxy.stop()
        tls_srv.close()
        ssh_srv.close()
        await origin.close()
        shutil.rmtree(etc, ignore_errors=True)


async def agent(scene: Scene, *argv: str) -> tuple[int, str, str]:
    """A capability-less process in the sandbox with an empty environment: no proxy at all."""
    return await run("ip", "netns", "exec", scene.sandbox.ns, "env", "-i", "PATH=/usr/bin:/bin",
                     *AGENT, *argv)  # fmt: skip


def fake_ip(scene: Scene, name: str) -> str:
    dns = next(li for li in scene.execution.listeners if li.kind == "dns")
    assert dns.fake_ips is not None
    addr = dns.fake_ips.address_for(name)
    assert addr is not None
    return str(addr)


async def test_curl_without_proxy_allowed_and_blocked(scene: Scene) -> None:
    rc, out, err = await agent(scene, "curl", "-sS", "--noproxy", "*", "--max-time", "10",
                               "http://www.test/hello")  # fmt: skip
    assert rc == 0, err
    assert json.loads(out)["path"] == "/hello"
    addr = fake_ip(scene, "www.test")
    lookup = await scene.audit.wait_for(method="DNS", host="www.test", qtype="A")
    assert (lookup["decision"], lookup["answer"], lookup["mode"]) == ("allow", addr, "transparent")
    event = await scene.audit.wait_for(method="GET", host="www.test")
    assert (event["decision"], event["mode"], event["orig_dst"]) == ("allow", "transparent",
                                                                     f"{addr}:80")  # fmt: skip
    assert (event["addr"], event["status"], event["rule"]) == (scene.upstream.addr_ns, 200,
                                                               "www.test")  # fmt: skip
    assert event["client_id"] == scene.execution.client_id

    # a blocked name does not even resolve: NXDOMAIN, audited
    rc, _, err = await agent(scene, "curl", "-sS", "--noproxy", "*", "--max-time", "10",
                             "http://evil.test/")  # fmt: skip
    assert rc == 6, err  # curl: could not resolve host
    lookup = await scene.audit.wait_for(method="DNS", host="evil.test", qtype="A")
    assert (lookup["decision"], lookup["rcode"], lookup["rule"]) == ("block", "NXDOMAIN",
                                                                     "evil.test")  # fmt: skip
    # ... and a blocked Host on an allowed name's address is judged by the Host: 403
    rc, out, err = await agent(scene, "curl", "-sS", "-i", "--noproxy", "*", "--max-time",
                               "10", "--resolve", f"evil.test:80:{addr}",
                               "http://evil.test/")  # fmt: skip
    assert " 403 " in out.splitlines()[0], (out, err)
    event = await scene.audit.wait_for(method="GET", host="evil.test")
    assert (event["decision"], event["reason"], event["mode"]) == ("block", "block_rule",
                                                                   "transparent")  # fmt: skip


async def test_node_fetch_without_proxy_allowed_and_blocked(scene: Scene) -> None:
    script = (
        "const url = process.argv[1];"
        "fetch(url).then(async r => console.log('status', r.status, await r.text()))"
        ".catch(e => { console.log('error', e.cause ? e.cause.code : e.message); })"
    )
    rc, out, err = await agent(scene, "node", "-e", script, "http://www.test/node")
    assert rc == 0, err
    assert out.startswith("status 200"), (out, err)
    assert '"/node"' in out
    event = await scene.audit.wait_for(method="GET", host="www.test", path="/node")
    assert (event["decision"], event["mode"]) == ("allow", "transparent")

    rc, out, err = await agent(scene, "node", "-e", script, "http://evil.test/node")
    assert out.strip() in ("error ENOTFOUND", "error EAI_AGAIN"), (out, err)
    lookup = await scene.audit.wait_for(method="DNS", host="evil.test")
    assert lookup["decision"] == "block"
    assert not scene.audit.find(method="GET", host="evil.test", decision="allow")


RAW_CLIENT = """
import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
try:
    s = socket.create_connection((host, port), timeout=5)
    banner = s.makefile("rb").readline()
    s.sendall(b"abc\\n")
    print("banner", banner.decode().strip(), "reply", s.recv(100).decode().strip())
except OSError as exc:
    print("refused", type(exc).__name__)
"""


async def test_raw_tcp_client_to_host_port_rule(scene: Scene) -> None:
    rc, out, err = await agent(scene, sys.executable, "-c", RAW_CLIENT, "git.test", "22")
    assert rc == 0, err
    assert out.strip() == "banner SSH-2.0-egress-test reply cba", (out, err)
    event = await scene.audit.wait_for(host="git.test", port=22, method="CONNECT")
    assert (event["decision"], event["rule"], event["mode"]) == ("allow", "git.test:22",
                                                                 "transparent")  # fmt: skip
    assert event["orig_dst"] == f"{fake_ip(scene, 'git.test')}:22"
    assert event["bytes_up"] == 4

    # the same host on a port no rule names: reset, audited
    rc, out, err = await agent(scene, sys.executable, "-c", RAW_CLIENT, "git.test", "2222")
    assert out.startswith("refused") or "banner  reply" in out, (out, err)
    event = await scene.audit.wait_for(host="git.test", port=2222)
    assert (event["decision"], event["reason"], event["end"]) == ("block", "port_not_allowed",
                                                                  "reset")  # fmt: skip


async def test_udp_other_than_dns_is_dropped(scene: Scene) -> None:
    script = (
        "import socket\n"
        "u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "try:\n"
        f"    u.sendto(b'x', ('{scene.upstream.addr_ns}', 9999)); print('sent')\n"
        "except OSError as exc:\n"
        "    print('dropped', exc.errno)\n"
    )
    rc, out, err = await agent(scene, sys.executable, "-c", script)
    assert rc == 0, err
    assert out.strip() == "dropped 1", out  # EPERM: the backstop rejected it in OUTPUT


async def tls_via(scene: Scene, sni: str, cert: str) -> str:
    script = (
        "import socket, ssl, sys\n"
        "ctx = ssl.create_default_context(cadata=sys.argv[2])\n"
        "try:\n"
        "    raw = socket.create_connection(('tls.test', 443), timeout=5)\n"
        "    s = ctx.wrap_socket(raw, server_hostname=sys.argv[1])\n"
        "    s.sendall(b'hi'); print(s.recv(100).decode())\n"
        "except (OSError, ssl.SSLError) as exc:\n"
        "    print('refused', type(exc).__name__)\n"
    )
    pem = Path(cert).read_text()  # the agent (nobody) cannot read pytest's tmp dir
    _, out, err = await agent(scene, sys.executable, "-c", script, sni, pem)
    return out.strip() or err


async def test_red_team_counterparts_refused_and_audited(
    scene: Scene, cert: tuple[str, str]
) -> None:
    # SNI: judged by the ClientHello's name. Allowed relays; a blocked SNI on an allowed
    # name's address (the fronting attempt) is reset
    assert await tls_via(scene, "tls.test", cert[0]) == "tls-echo:hi"
    assert (await tls_via(scene, "evil.test", cert[0])).startswith("refused")
    event = await scene.audit.wait_for(sni="evil.test")
    assert (event["decision"], event["host"], event["end"]) == ("block", "evil.test", "reset")
    assert event["orig_dst"] == f"{fake_ip(scene, 'tls.test')}:443"
    # rebinding: an allowed name whose (pinned) address is loopback, on a raw port
    _, out, _ = await agent(scene, "curl", "-sS", "-i", "--noproxy", "*", "--max-time", "10",
                            "http://rebind.test/")  # fmt: skip
    assert " 403 " in out.splitlines()[0], out
    event = await scene.audit.wait_for(host="rebind.test", method="GET")
    assert (event["decision"], event["reason"]) == ("block", "reserved_address")
    # address spellings: never answered as names, and refused as a Host too
    ask = (
        "import sys, dns.message, dns.query, dns.rcode\n"
        "q = dns.message.make_query('2130706433', 'A')\n"
        "print(dns.rcode.to_text(dns.query.udp(q, sys.argv[1], timeout=5).rcode()))\n"
    )
    _, out, err = await agent(scene, sys.executable, "-c", ask, scene.upstream.addr_ns)
    assert out.strip() == "NXDOMAIN", (out, err)  # asked of any address: it is redirected
    event = await scene.audit.wait_for(method="DNS", reason="not_a_name")
    assert (event["decision"], event["host"]) == ("block", "127.0.0.1")
    www = fake_ip(scene, "www.test")
    _, out, _ = await agent(scene, "curl", "-sS", "-i", "--noproxy", "*", "--max-time", "10",
                            "-H", "Host: 0x7f.1", f"http://{www}/")  # fmt: skip
    assert " 403 " in out.splitlines()[0], out
    event = await scene.audit.wait_for(host="127.0.0.1", method="GET")
    assert (event["reason"], event["mode"]) == ("reserved_address", "transparent")
    # an address of the proxy's own host, dialed as a literal: no name, so judged (and
    # refused) as the address itself, never dialed
    _, out, err = await agent(scene, sys.executable, "-c", RAW_CLIENT, scene.sandbox.addr_root,
                              "22")  # fmt: skip
    assert out.startswith("refused") or "banner  reply" in out, (out, err)
    event = await scene.audit.wait_for(host=scene.sandbox.addr_root, port=22)
    assert (event["decision"], event["reason"], event["end"]) == ("block", "default_deny",
                                                                  "reset")  # fmt: skip
    assert "addr" not in event


async def test_socks5_in_the_sandbox(scene: Scene) -> None:
    rc, out, err = await agent(scene, "curl", "-sS", "--max-time", "10", "--socks5-hostname",
                               "127.0.0.1:1080", "http://socks.test/s")  # fmt: skip
    assert rc == 0, err
    assert json.loads(out)["path"] == "/s"
    event = await scene.audit.wait_for(host="socks.test", mode="socks5")
    assert (event["decision"], event["client_id"]) == ("allow", scene.execution.client_id)
    rc, _, err = await agent(scene, "curl", "-sS", "--max-time", "10", "--socks5-hostname",
                             "127.0.0.1:1080", "http://evil.test/")  # fmt: skip
    assert rc == 97, err
    event = await scene.audit.wait_for(host="evil.test", mode="socks5")
    assert (event["reason"], event["socks_reply"]) == ("block_rule", 2)


async def test_restore_removes_every_redirect(scene: Scene) -> None:
    import netcut

    save = ["ip", "netns", "exec", scene.sandbox.ns, "iptables-legacy-save", "-t", "nat"]
    assert "NETCUT_REDIRECT" in subprocess.run(save, capture_output=True, text=True).stdout
    await release_execution(scene.proxy, scene.execution, restore=True)
    assert "NETCUT_REDIRECT" not in subprocess.run(save, capture_output=True, text=True).stdout
    assert (await netcut.status_async(scene.sandbox.ns)).state == "not cut"
    routes = subprocess.run(["ip", "-n", scene.sandbox.ns, "route"], capture_output=True,
                            text=True).stdout  # fmt: skip
    assert "dev lo" not in routes


KEEP_ALIVE = """
import socket
s = socket.create_connection(("www.test", 80), timeout=5)
f = s.makefile("rb")
for host in ("www.test", "evil.test", "www.test"):
    s.sendall(f"GET /k HTTP/1.1\\r\\nHost: {host}\\r\\n\\r\\n".encode())
    status = f.readline().split()[1].decode()
    length = 0
    while (line := f.readline()) not in (b"\\r\\n", b""):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    f.read(length)
    print(host, status)
"""


async def test_every_request_on_a_kept_alive_connection_is_judged(scene: Scene) -> None:
    rc, out, err = await agent(scene, sys.executable, "-c", KEEP_ALIVE)
    assert rc == 0, err
    assert out.split("\n")[:3] == ["www.test 200", "evil.test 403", "www.test 200"], (out, err)
    assert len(scene.audit.find(method="GET", host="www.test", path="/k", decision="allow")) == 2
    event = await scene.audit.wait_for(method="GET", host="evil.test", path="/k")
    assert (event["decision"], event["orig_dst"]) == ("block", f"{fake_ip(scene, 'www.test')}:80")


async def test_a_direct_connection_to_the_listener_is_refused(scene: Scene) -> None:
    """Not redirected: its original destination is the listener itself, an address the
    guard (or the policy) refuses; never a loop back into the proxy."""
    _, out, err = await agent(scene, sys.executable, "-c", RAW_CLIENT, "127.0.0.1", "15001")
    assert out.startswith("refused") or "banner  reply" in out, (out, err)
    event = await scene.audit.wait_for(
        mode="transparent", orig_dst="127.0.0.1:15001", method="CONNECT"
    )
    assert event["decision"] == "block"
    assert event["reason"] in ("default_deny", "port_not_allowed", "reserved_address")
    assert "addr" not in event


async def test_the_cuts_probe_is_recorded_as_a_probe(
    scene: Scene, monkeypatch: pytest.MonkeyPatch
) -> None:
    """prepare_execution's probe of the transparent listener is no request the agent made:
    a lifecycle record (method PROBE), never `block CONNECT 127.0.0.1:15001`; also when the
    proxy accepts the probe's connection only after the probe returned (prepared again with
    the proxy's loop held for the whole cut, as a busy machine may hold it)."""
    import netcut

    def to_the_listener() -> list[dict[str, object]]:
        return scene.audit.find(mode="transparent", orig_dst="127.0.0.1:15001")

    await scene.audit.wait_for(mode="transparent", orig_dst="127.0.0.1:15001")
    await release_execution(scene.proxy, scene.execution, restore=True)

    async def loop_held(target: str, keep: list[str], **kwargs: Any) -> object:
        return netcut.cut_and_status(target, keep, **kwargs)

    monkeypatch.setattr(netcut, "cut_and_status_async", loop_held)
    scene.execution = await prepare_execution(scene.sandbox.ns, POLICY, scene.proxy,
                                              transparent=True, socks_port=1080)  # fmt: skip
    async with asyncio.timeout(5):
        while len(to_the_listener()) < 2:
            scene.audit.changed.clear()
            await scene.audit.changed.wait()
    probes = scene.audit.find(reason="listener_probe")
    assert len(probes) == 2, scene.audit.events
    assert all(p["method"] == "PROBE" and p["decision"] == "allow" for p in probes)
    assert all(p["orig_dst"] == "127.0.0.1:15001" for p in probes)
    assert not scene.audit.find(method="CONNECT", orig_dst="127.0.0.1:15001")

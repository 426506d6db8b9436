"""The proxy against real sockets and real clients (curl, ssl, raw).

Upstreams listen on loopback ports that the guard lets through (`proxykit.exempt`), so these
tests need no root; a TLS upstream there is allowed by `https://` rules, whose ports get the
SNI check of 443. Three keep a test host: curl over HTTPS end to end and the IP-literal case
on port 443 itself, and the host-local guard (an address of this host's own interface)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import os
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from egress.config import ClientSpec, Settings, build_settings
from egress.policy.rules import Policy
from egress.proxy.server import EgressProxy, Limits

import harness
from proxykit import MemoryAudit, exempt, raw_exchange, read_response
from servers import LOOPBACK, Origin, echo, listen, port_of, run, start_origin, start_tcp


@dataclass
class World:
    host: harness.TestHost | None  # None: upstreams on loopback
    origin: Origin
    proxy: EgressProxy
    audit: MemoryAudit
    echo_port: int = 7000
    tls_port: int = 443

    @property
    def addr(self) -> str:
        return self.origin.addr

    @property
    def web(self) -> str:
        """The origin as a URL names it: `ADDR` (port 80 in a test host) or `ADDR:PORT`."""
        return self.addr if self.host is not None else self.origin.authority

    @property
    def echo(self) -> str:
        return f"echo.test:{self.echo_port}"

    @property
    def paddr(self) -> tuple[str, int]:
        return self.proxy.addresses[0]


def make_settings(
    addr: str, web: int = 80, echo_port: int = 7000, alt: int = 8080, tls_port: int = 443
) -> Settings:
    # off 443, an https:// rule makes the TLS port one whose SNI is checked as on 443
    # (docs/proxy.md#tls-sni-check)
    tls = [] if tls_port == 443 else [f"https://{h}:{tls_port}" for h in ("tls.test", "www.test")]
    return build_settings(
        {
            "allow": [
                addr if web == 80 else f"{addr}:{web}",
                f"{addr}:{echo_port}",
                f"http://{addr}:{alt}",
                "tls.test",
                f"echo.test:{echo_port}",
                "www.test",
                *tls,
            ],
            "block": ["blocked.test", "evil.test"],
            "framework_routes": [],
        },
        resolve=[
            f"tls.test={addr}",
            f"evil.test={addr}",
            f"echo.test={addr}",
            f"www.test={addr}",
            "loopy.test=127.0.0.1",
            f"blocked.test={addr}",
        ],
    )


async def tls_echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        data = await reader.read(1024)
        writer.write(b"tls-echo:" + data)
        await writer.drain()
    except (ConnectionError, ssl.SSLError):
        pass
    finally:
        writer.close()


@contextlib.asynccontextmanager
async def serving(
    host: harness.TestHost | None, tls: ssl.SSLContext | None = None
) -> AsyncIterator[World]:
    """Origins on 80 and 8080, an echo on 7000 and with `tls` a TLS echo on 443 in `host`, or
    all on loopback ports."""
    web, alt, echo_port, tls_port = (80, 8080, 7000, 443) if host is not None else (0, 0, 0, 0)
    origin = await start_origin(host, web)
    origin8080 = await start_origin(host, alt)
    echo_srv = await start_tcp(host, echo_port, echo)
    echo_port = port_of(echo_srv)
    tls_srv = None
    if tls is not None:
        sock = listen(host, "0.0.0.0", tls_port)
        tls_srv = await asyncio.start_server(tls_echo, sock=sock, ssl=tls)
    tls_port = 443 if tls_srv is None else port_of(tls_srv)
    audit = MemoryAudit()
    if host is None:
        ports = (origin.port, echo_port, origin8080.port)
        more = () if tls_srv is None else (tls_port,)
        settings = exempt(make_settings(LOOPBACK, *ports, tls_port), *ports, *more)
    else:
        settings = make_settings(host.addr_ns)
    proxy = EgressProxy(settings, audit=audit)
    await proxy.start()
    try:
        yield World(host, origin, proxy, audit, echo_port, tls_port)
    finally:
        await proxy.stop()
        echo_srv.close()
        if tls_srv is not None:
            tls_srv.close()
        await origin.close()
        await origin8080.close()


@pytest.fixture
async def world() -> AsyncIterator[World]:
    async with serving(None) as w:
        yield w


@pytest.fixture
async def ns_world(test_host: harness.TestHost) -> AsyncIterator[World]:
    async with serving(test_host) as w:
        yield w


async def open_tunnel(
    world: World, target: str, extra: str = ""
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    reader, writer = await asyncio.open_connection(*world.paddr)
    writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{extra}\r\n".encode())
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    return reader, writer, head


# --- CONNECT ------------------------------------------------------------------------------


async def test_connect_relays_bytes_exactly_both_ways(world: World) -> None:
    payload = os.urandom(8 * 1024 * 1024 + 13)
    reader, writer, head = await open_tunnel(world, world.echo)
    assert head.startswith(b"HTTP/1.1 200 ")

    async def send() -> None:
        for i in range(0, len(payload), 100_000):
            writer.write(payload[i : i + 100_000])
            await writer.drain()
        writer.write_eof()

    sender = asyncio.create_task(send())
    got = await asyncio.wait_for(reader.read(-1), 30)
    await sender
    writer.close()
    assert hashlib.sha256(got).hexdigest() == hashlib.sha256(payload).hexdigest()
    event = await world.audit.wait_for(method="CONNECT", host="echo.test")
    assert event["decision"] == "allow"
    assert event["bytes_up"] == len(payload)
    assert event["bytes_down"] == len(payload)
    assert event["addr"] == world.addr
    assert event["rule"] == world.echo


async def test_blocked_connect_gets_403_proxy_status_and_audit(world: World) -> None:
    _reader, writer, head = await open_tunnel(world, "evil.test:443")
    writer.close()
    assert head.startswith(b"HTTP/1.1 403 ")
    assert b"Proxy-Status: egress; error=http_request_denied" in head
    event = await world.audit.wait_for(host="evil.test")
    assert (event["decision"], event["reason"], event["rule"]) == (
        "block",
        "block_rule",
        "evil.test",
    )


async def test_connect_to_non_permitted_port(world: World) -> None:
    reply = await raw_exchange(*world.paddr, f"CONNECT {world.addr}:22 HTTP/1.1\r\n\r\n".encode())
    assert reply.startswith(b"HTTP/1.1 403 ")
    assert b"port_not_allowed" in reply
    assert not world.audit.find(decision="allow")


async def test_connect_without_port_is_400(world: World) -> None:
    reply = await raw_exchange(*world.paddr, b"CONNECT echo.test HTTP/1.1\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 400 ")
    assert b"http_request_error" in reply


async def test_half_close_is_honoured(world: World) -> None:
    reader, writer, _head = await open_tunnel(world, world.echo)
    writer.write(b"ping")
    writer.write_eof()  # we are done sending; the echo answers, then half-closes back
    assert await asyncio.wait_for(reader.read(-1), 5) == b"ping"
    writer.close()


# --- absolute-form --------------------------------------------------------------------------


async def test_get_and_post_fixed_and_chunked(world: World) -> None:
    url = f"http://{world.web}/path?q=1"
    rc, out, err = await run("curl", "-sS", "--max-time", "10", "-x", world.proxy.url, url)
    assert rc == 0, err
    seen = json.loads(out)
    assert (seen["method"], seen["path"], seen["host"]) == ("GET", "/path?q=1", world.web)

    body = os.urandom(300_000)
    bodyfile = Path(f"/tmp/egress-test-body-{os.getpid()}")
    bodyfile.write_bytes(body)
    try:
        for extra in ([], ["-H", "Transfer-Encoding: chunked"]):
            rc, out, err = await run(
                "curl",
                "-sS",
                "--max-time",
                "10",
                "-x",
                world.proxy.url,
                "--data-binary",
                f"@{bodyfile}",
                *extra,
                url,
            )
            assert rc == 0, err
            seen = json.loads(out)
            assert seen["method"] == "POST"
            assert seen["body_sha256"] == hashlib.sha256(body).hexdigest()
            if extra:
                assert seen["headers"]["transfer-encoding"] == "chunked"
    finally:
        bodyfile.unlink()


async def test_chunked_response_and_hop_by_hop_removed(world: World) -> None:
    reader, writer = await asyncio.open_connection(*world.paddr)
    writer.write(
        f"GET http://{world.web}/chunked/5000 HTTP/1.1\r\nHost: {world.web}\r\n\r\n".encode()
        + f"GET http://{world.web}/x HTTP/1.1\r\nHost: liar.example\r\nConnection: x-secret\r\n"
        f"X-Secret: 1\r\nProxy-Authorization: Basic Zm9vOmJhcg==\r\nTE: trailers\r\n"
        f"Keep-Alive: 5\r\nProxy-Connection: keep-alive\r\nUpgrade: h2c\r\n\r\n".encode()
    )
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head.lower()
    body = b""
    while not body.endswith(b"0\r\n\r\n"):
        body += await asyncio.wait_for(reader.read(65536), 5)
    assert body.count(b"y") == 5000
    status, _, raw = await read_response(reader)
    writer.close()
    seen = json.loads(raw)
    assert status == 200
    assert seen["host"] == world.web  # a client Host that disagrees never wins
    for name in (
        "x-secret",
        "proxy-authorization",
        "te",
        "keep-alive",
        "proxy-connection",
        "upgrade",
        "connection",
    ):
        assert name not in seen["headers"]


async def test_keep_alive_second_request_to_blocked_host_is_refused(world: World) -> None:
    reader, writer = await asyncio.open_connection(*world.paddr)
    writer.write(f"GET http://{world.web}/first HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    status, _, _ = await read_response(reader)
    assert status == 200
    writer.write(b"GET http://evil.test/second HTTP/1.1\r\nHost: x\r\n\r\n")
    status, headers, body = await read_response(reader)
    assert status == 403
    assert "http_request_denied" in headers["proxy-status"]
    assert b"evil.test" in body
    writer.write(f"GET http://{world.web}/third HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    status, _, _ = await read_response(reader)
    writer.close()
    assert status == 200
    assert [s.path for s in world.origin.seen] == ["/first", "/third"]


async def test_origin_form_and_userinfo_refused(world: World) -> None:
    for req in (
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        f"GET http://u:p@{world.web}/ HTTP/1.1\r\nHost: x\r\n\r\n".encode(),
    ):
        reply = await raw_exchange(*world.paddr, req)
        assert reply.startswith(b"HTTP/1.1 400 ")
    assert world.origin.seen == []


# --- the address guard ----------------------------------------------------------------------


LOOPBACK_SPELLINGS = [
    "127.0.0.1",
    "2130706433",
    "0177.0.0.1",
    "0x7f.1",
    "127.1",
    "[::ffff:127.0.0.1]",
    "[::1]",
    "loopy.test",
    "0.0.0.0",
]


async def test_every_loopback_spelling_refused() -> None:
    audit = MemoryAudit()
    settings = build_settings({"default": "allow"}, resolve=["loopy.test=127.0.0.1"])
    async with EgressProxy(settings, audit=audit) as proxy:
        for host in LOOPBACK_SPELLINGS:
            for req in (
                f"CONNECT {host}:443 HTTP/1.1\r\n\r\n",
                f"GET http://{host}:{proxy.addresses[0][1]}/ HTTP/1.1\r\nConnection: close\r\n\r\n",
            ):
                reply = await raw_exchange(*proxy.addresses[0], req.encode())
                assert reply.startswith(b"HTTP/1.1 403 "), (host, reply[:200])
                assert b"destination_ip_prohibited" in reply
    assert {e["reason"] for e in audit.events} == {"reserved_address"}
    assert len(audit.events) == 2 * len(LOOPBACK_SPELLINGS)


@pytest.mark.netns
async def test_host_local_address_refused(test_host: harness.TestHost) -> None:
    # the root side of the test host's veth is an address of the proxy's own host
    async with EgressProxy(Policy(default="allow")) as proxy:
        req = f"CONNECT {test_host.addr_root}:443 HTTP/1.1\r\n\r\n".encode()
        reply = await raw_exchange(*proxy.addresses[0], req)
    assert reply.startswith(b"HTTP/1.1 403 ")
    assert b"host_local" in reply


async def test_framework_route_on_loopback_reached() -> None:
    from aiohttp import web

    app = web.Application()

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        policy = Policy(block=["127.0.0.0/8"], framework_routes=[f"http://127.0.0.1:{port}/v1"])
        async with EgressProxy(policy) as proxy:
            rc, out, err = await run(
                "curl",
                "-sS",
                "--max-time",
                "5",
                "-x",
                proxy.url,
                f"http://127.0.0.1:{port}/v1/models",
            )
            assert rc == 0, err
            assert json.loads(out) == {"ok": True}
            other = await raw_exchange(
                *proxy.addresses[0],
                f"GET http://127.0.0.1:{port + 1}/ HTTP/1.1\r\nConnection: close\r\n\r\n".encode(),
            )
            assert other.startswith(b"HTTP/1.1 403 ")
    finally:
        await runner.cleanup()


# --- smuggling and limits -------------------------------------------------------------------

SMUGGLING = {
    "cl-and-te": "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
    "two-cl": "Content-Length: 5\r\nContent-Length: 6\r\n",
    "cl-list": "Content-Length: 5, 6\r\n",
    "te-not-chunked": "Transfer-Encoding: gzip\r\n",
    "te-xchunked": "Transfer-Encoding: xchunked\r\n",
    "obs-fold": "X-A: b\r\n c\r\n",
    "bare-cr": "X-A: b\rc\r\n",
    "space-before-colon": "Content-Length : 5\r\n",
    "nul": "X-A: b\x00\r\n",
}


@pytest.mark.parametrize("fields", SMUGGLING.values(), ids=SMUGGLING.keys())
async def test_smuggling_shapes_refused_and_others_served(world: World, fields: str) -> None:
    bystander_r, bystander_w = await asyncio.open_connection(*world.paddr)
    req = f"POST http://{world.web}/ HTTP/1.1\r\nHost: x\r\n{fields}\r\nhello".encode()
    reply = await raw_exchange(*world.paddr, req)
    assert reply.startswith(b"HTTP/1.1 400 "), reply[:200]
    assert b"http_request_error" in reply
    bystander_w.write(f"GET http://{world.web}/ok HTTP/1.1\r\n\r\n".encode())
    status, _, _ = await read_response(bystander_r)
    bystander_w.close()
    assert status == 200
    assert [s.path for s in world.origin.seen] == ["/ok"]
    assert world.audit.find(decision="error", reason="bad_request")


async def test_bad_chunked_body_closes_cleanly(world: World) -> None:
    req = (
        f"POST http://{world.web}/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        "zz\r\nhello\r\n0\r\n\r\n"
    ).encode()
    reply = await raw_exchange(*world.paddr, req)
    assert b" 200 " not in reply.split(b"\r\n", 1)[0]


async def test_oversized_head_is_431(world: World) -> None:
    req = f"GET http://{world.web}/ HTTP/1.1\r\nX-Big: {'a' * 20000}\r\n\r\n".encode()
    reply = await raw_exchange(*world.paddr, req)
    assert reply.startswith(b"HTTP/1.1 431 ")


async def test_too_many_headers_is_431(world: World) -> None:
    fields = "".join(f"X-{i}: v\r\n" for i in range(150))
    reply = await raw_exchange(
        *world.paddr, f"GET http://{world.web}/ HTTP/1.1\r\n{fields}\r\n".encode()
    )
    assert reply.startswith(b"HTTP/1.1 431 ")


async def test_head_timeout_and_idle_do_not_delay_others() -> None:
    origin = await start_origin(None, 0)
    limits = Limits(head_timeout=0.3, idle_timeout=0.6)
    settings = exempt(Policy(allow=[origin.authority]), origin.port)
    try:
        async with EgressProxy(settings, limits=limits) as proxy:
            slow_r, slow_w = await asyncio.open_connection(*proxy.addresses[0])
            slow_w.write(b"GET http://")  # never finishes its head
            idle_r, idle_w = await asyncio.open_connection(*proxy.addresses[0])
            rc, _out, _ = await run(
                "curl", "-sS", "--max-time", "5", "-x", proxy.url, f"http://{origin.authority}/"
            )
            assert rc == 0
            slow_reply = await asyncio.wait_for(slow_r.read(-1), 5)
            assert slow_reply.startswith(b"HTTP/1.1 408")
            assert await asyncio.wait_for(idle_r.read(-1), 5) == b""
            slow_w.close()
            idle_w.close()
    finally:
        await origin.close()


async def test_max_connections_503() -> None:
    async with EgressProxy(Policy(), limits=Limits(max_connections=2)) as proxy:
        held = [await asyncio.open_connection(*proxy.addresses[0]) for _ in range(2)]
        reply = await raw_exchange(*proxy.addresses[0], b"")
        assert reply.startswith(b"HTTP/1.1 503 ")
        for _, w in held:
            w.close()


async def test_slow_reader_keeps_proxy_memory_bounded(world: World) -> None:
    total = 0
    stalled = asyncio.Event()

    async def firehose(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal total
        chunk = b"z" * 65536
        try:
            while total < 512 * 1024 * 1024:
                writer.write(chunk)
                total += len(chunk)
                try:
                    await asyncio.wait_for(writer.drain(), 0.5)
                except TimeoutError:
                    stalled.set()  # the proxy stopped reading: backpressure reached us
                    await writer.drain()
            writer.close()
        except ConnectionError:
            pass

    server = await start_tcp(world.host, 0, firehose)
    port = port_of(server)
    policy = exempt(Policy(allow=[f"{world.addr}:{port}"]), port)
    async with EgressProxy(policy) as proxy:
        reader, writer = await asyncio.open_connection(*proxy.addresses[0], limit=64 * 1024)
        writer.write(f"CONNECT {world.addr}:{port} HTTP/1.1\r\n\r\n".encode())
        await writer.drain()
        await reader.readuntil(b"\r\n\r\n")
        # read nothing: the firehose must stall well before 512 MiB
        await asyncio.wait_for(stalled.wait(), 20)
        stalled_at = total
        assert stalled_at < 64 * 1024 * 1024
        for conn in proxy._conns:
            assert conn.side.transport is not None
            assert conn.side.transport.get_write_buffer_size() <= 2 * 1024 * 1024
        writer.close()
    server.close()


# --- TLS and SNI ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    d = tmp_path_factory.mktemp("tls")
    key, crt = str(d / "key.pem"), str(d / "crt.pem")
    import subprocess

    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            key,
            "-out",
            crt,
            "-days",
            "2",
            "-subj",
            "/CN=tls.test",
            "-addext",
            "subjectAltName=DNS:tls.test,DNS:evil.test,DNS:www.test",
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )
    return crt, key


def server_context(cert: tuple[str, str]) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(*cert)
    return ctx


@pytest.fixture
async def tls_world(test_host: harness.TestHost, cert: tuple[str, str]) -> AsyncIterator[World]:
    """The TLS echo on port 443 of a test host: SNI checked because the port is 443."""
    async with serving(test_host, server_context(cert)) as w:
        yield w


@pytest.fixture
async def tls_loop(cert: tuple[str, str]) -> AsyncIterator[World]:
    """The TLS echo on a loopback port, allowed by `https://` rules: SNI checked as on 443."""
    async with serving(None, server_context(cert)) as w:
        yield w


async def tls_through(world: World, connect_to: str, sni: str, cert: tuple[str, str]) -> bytes:
    ctx = ssl.create_default_context(cafile=cert[0])
    reader, writer, head = await open_tunnel(world, connect_to)
    assert head.startswith(b"HTTP/1.1 200 "), head
    await writer.start_tls(ctx, server_hostname=sni)
    writer.write(b"hi")
    data = await asyncio.wait_for(reader.read(100), 5)
    writer.close()
    return data


async def test_tls_allowed_sni_relays(tls_loop: World, cert: tuple[str, str]) -> None:
    target = f"tls.test:{tls_loop.tls_port}"
    assert await tls_through(tls_loop, target, "tls.test", cert) == b"tls-echo:hi"
    # SNI naming another allowed host on the same port is fine too
    assert await tls_through(tls_loop, target, "www.test", cert) == b"tls-echo:hi"


async def test_blocked_sni_inside_allowed_connect_is_cut(
    tls_loop: World, cert: tuple[str, str]
) -> None:
    tls_world = tls_loop
    with pytest.raises((ConnectionError, ssl.SSLError, asyncio.IncompleteReadError)):
        await tls_through(tls_world, f"tls.test:{tls_world.tls_port}", "evil.test", cert)
    event = await tls_world.audit.wait_for(reason="sni_mismatch")
    assert event["decision"] == "block"
    assert event["sni"] == "evil.test"
    assert event["host"] == "tls.test"


@pytest.mark.netns
async def test_curl_https_through_connect(tls_world: World, cert: tuple[str, str]) -> None:
    # the path end to end through a test host: curl, CONNECT, TLS to port 443
    # curl speaks TLS to our echo, which answers with a non-HTTP line: curl fails *after* the
    # tunnel and handshake succeed, so check the audit line and curl's verbose output.
    _rc, _out, err = await run(
        "curl",
        "-sS",
        "-v",
        "--max-time",
        "5",
        "--cacert",
        cert[0],
        "-x",
        tls_world.proxy.url,
        "https://tls.test/",
    )
    assert "HTTP/1.1 200 Connection established" in err
    assert "SSL connection using" in err
    event = await tls_world.audit.wait_for(method="CONNECT", host="tls.test")
    assert event["decision"] == "allow"


# --- clients and tokens -----------------------------------------------------------------------


async def test_tokens_select_client_policy(world: World) -> None:
    settings = world.proxy.settings
    limited = ClientSpec("sandbox-a", Policy(allow=[f"http://{world.web}"]), token="s3cret-a")
    audit = MemoryAudit()
    async with EgressProxy(
        Settings(settings.policy, settings.guard, settings.resolve, (limited,)),
        require_auth=True,
        audit=audit,
    ) as proxy:
        url = f"http://{world.web}/tok"
        _, out, _ = await run("curl", "-sS", "-i", "--max-time", "5", "-x", proxy.url, url)
        assert " 407 " in out.splitlines()[0]
        assert "Proxy-Authenticate: Basic" in out
        wrong = proxy.proxy_url("nope", "sandbox-a")
        _, out, _ = await run("curl", "-sS", "-i", "--max-time", "5", "-x", wrong, url)
        assert " 407 " in out.splitlines()[0]
        right = proxy.proxy_url("s3cret-a", "sandbox-a")
        _rc, out, _ = await run("curl", "-sS", "--max-time", "5", "-x", right, url)
        assert json.loads(out)["path"] == "/tok"
        # sandbox-a's own policy does not allow CONNECT to the echo
        cred = base64.b64encode(b"sandbox-a:s3cret-a").decode()
        reply = await raw_exchange(
            *proxy.addresses[0],
            (
                f"CONNECT {world.echo} HTTP/1.1\r\nProxy-Authorization: Basic {cred}\r\n\r\n"
            ).encode(),
        )
        assert reply.startswith(b"HTTP/1.1 403 ")
    assert [e["reason"] for e in audit.events] == [
        "auth_required",
        "auth_failed",
        "allow_rule",
        "default_deny",  # an address rule admits addresses, not echo.test resolving there
    ]
    assert [e.get("client_id") for e in audit.events][2:] == ["sandbox-a", "sandbox-a"]
    assert not any("s3cret" in repr(e) for e in audit.events)  # the token is never logged


async def test_malformed_client_hello_is_cut(tls_loop: World) -> None:
    tls_world = tls_loop
    reader, writer, head = await open_tunnel(tls_world, f"tls.test:{tls_world.tls_port}")
    assert head.startswith(b"HTTP/1.1 200 ")
    writer.write(b"\x16\x03\x01\x00\x05\x02\x00\x00\x01\x00")  # a record that is no ClientHello
    assert await asyncio.wait_for(reader.read(-1), 5) == b""
    writer.close()
    event = await tls_world.audit.wait_for(reason="sni_mismatch")
    assert "malformed" in str(event["detail"])


@pytest.mark.netns
async def test_non_tls_on_443_follows_sni_missing_option(tls_world: World) -> None:
    # a named, allowed CONNECT host: the default ("if-named") lets it through
    reader, writer, head = await open_tunnel(tls_world, "tls.test:443")
    writer.write(b"plain bytes, not TLS")
    await writer.drain()
    writer.close()
    # an IP literal carries no name to vouch for it: refused without SNI
    reader, writer, head = await open_tunnel(tls_world, f"{tls_world.addr}:443")
    assert head.startswith(b"HTTP/1.1 200 ")
    writer.write(b"plain bytes, not TLS")
    assert await asyncio.wait_for(reader.read(-1), 5) == b""
    writer.close()
    event = await tls_world.audit.wait_for(reason="sni_missing")
    assert event["host"] == tls_world.addr
    assert not tls_world.audit.find(reason="sni_missing", host="tls.test")

"""SOCKS5 against real sockets: curl --socks5-hostname, an ssh-style raw TCP session, and the
red-team cases of CONNECT (address spellings, loopback literals, rebinding, SNI mismatch),
each refused with its SOCKS reply code and audited.

Upstreams listen on loopback ports that the guard lets through (`proxykit.exempt`), so most
tests need no root; `egress serve --socks` keeps a test host (the path end to end)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from egress.config import ClientSpec, build_settings
from egress.policy.rules import Policy
from egress.proxy.codec import socks5
from egress.proxy.server import EgressProxy

import harness
from proxykit import MemoryAudit, exempt
from servers import Origin, listen, port_of, run, start_origin, start_tcp


@dataclass
class World:
    host: harness.TestHost | None  # None: upstreams on loopback
    origin: Origin
    proxy: EgressProxy
    audit: MemoryAudit
    ssh_port: int = 22

    @property
    def web_port(self) -> int:
        return self.origin.port

    @property
    def socks(self) -> tuple[str, int]:
        return self.proxy.socks_addresses[0]


async def ssh_like(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Server speaks first (a banner), reads the client's, then answers each line reversed."""
    try:
        writer.write(b"SSH-2.0-egress-test\r\n")
        await writer.drain()
        banner = await reader.readline()
        writer.write(b"hello " + banner)
        while line := await reader.readline():
            writer.write(line.rstrip(b"\n")[::-1] + b"\n")
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


@contextlib.asynccontextmanager
async def serving(
    host: harness.TestHost | None, tls_port: int | None = None
) -> AsyncIterator[World]:
    """An origin on 80 and the ssh-like server on 22 in `host`, or on loopback ports (and
    `https://tls.test:TLS_PORT` allowed, its SNI checked as on 443)."""
    origin = await start_origin(host, 80 if host else 0)
    ssh_srv = await start_tcp(host, 22 if host else 0, ssh_like)
    web, ssh = origin.port, port_of(ssh_srv)
    addr = origin.addr
    tls = [] if tls_port is None else [f"https://tls.test:{tls_port}"]
    audit = MemoryAudit()
    settings = build_settings(
        {
            # the loopback rules and rebind.test make the red-team cases reach the guard
            "allow": [f"www.test:{web}", f"git.test:{ssh}", "tls.test", "127.0.0.0/8", "[::1]",
                      "rebind.test", *tls],
            "block": ["evil.test"],
        },
        resolve=[f"www.test={addr}", f"git.test={addr}", f"tls.test={addr}",
                 f"evil.test={addr}", "rebind.test=127.0.0.1"],
    )  # fmt: skip
    if host is None:
        settings = exempt(settings, web, ssh, *([] if tls_port is None else [tls_port]))
    proxy = EgressProxy(settings, socks=["127.0.0.1:0"], audit=audit)
    await proxy.start()
    try:
        yield World(host, origin, proxy, audit, ssh)
    finally:
        await proxy.stop()
        ssh_srv.close()
        await origin.close()


@pytest.fixture
async def world() -> AsyncIterator[World]:
    async with serving(None) as w:
        yield w


async def socks_connect(
    world: World, host: str, port: int, creds: tuple[str, str] | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    """Handshake and CONNECT; returns the 10-byte reply (or less if the proxy closed)."""
    reader, writer = await asyncio.open_connection(*world.socks)
    writer.write(b"\x05\x01\x02" if creds else b"\x05\x01\x00")
    assert await reader.readexactly(2) == (b"\x05\x02" if creds else b"\x05\x00")
    if creds:
        user, password = (c.encode() for c in creds)
        writer.write(bytes([1, len(user)]) + user + bytes([len(password)]) + password)
        assert await reader.readexactly(2) == b"\x01\x00"
    writer.write(socks5.serialize_request(host, port))
    reply = await asyncio.wait_for(reader.read(10), 5)
    return reader, writer, reply


async def test_curl_socks5_hostname_allowed_and_blocked(world: World) -> None:
    proxy = "socks5h://{}:{}".format(*world.socks)
    url = f"http://www.test:{world.web_port}/x"
    rc, out, err = await run("curl", "-sS", "--max-time", "10", "-x", proxy, url)
    assert rc == 0, err
    assert '"path": "/x"' in out or "/x" in out
    event = await world.audit.wait_for(host="www.test", decision="allow")
    assert (event["method"], event["mode"], event["port"]) == ("CONNECT", "socks5", world.web_port)
    assert event["addr"] == world.origin.addr
    assert event["rule"] == f"www.test:{world.web_port}"
    assert event["socks_reply"] == 0
    assert int(event["bytes_down"]) > 0  # type: ignore[call-overload]

    rc, _, err = await run("curl", "-sS", "--max-time", "10", "--socks5-hostname",
                           "{}:{}".format(*world.socks), "http://evil.test/")  # fmt: skip
    assert rc == 97, err  # curl: proxy handshake error
    assert "not allowed" in err.lower() or "connection" in err.lower()
    event = await world.audit.wait_for(host="evil.test")
    assert (event["decision"], event["reason"]) == ("block", "block_rule")
    assert event["rule"] == "evil.test"
    assert (event["mode"], event["socks_reply"]) == ("socks5", 2)


async def test_ssh_style_session_through_socks(world: World) -> None:
    reader, writer, reply = await socks_connect(world, "git.test", world.ssh_port)
    assert reply[:2] == b"\x05\x00"
    assert await reader.readline() == b"SSH-2.0-egress-test\r\n"
    writer.write(b"SSH-2.0-client\n")
    assert await reader.readline() == b"hello SSH-2.0-client\n"
    for line in (b"abc", b"0123456789" * 100):
        writer.write(line + b"\n")
        assert await asyncio.wait_for(reader.readline(), 5) == line[::-1] + b"\n"
    writer.close()
    event = await world.audit.wait_for(host="git.test", decision="allow")
    ssh = world.ssh_port
    assert (event["port"], event["rule"], event["mode"]) == (ssh, f"git.test:{ssh}", "socks5")
    assert event["bytes_up"] == len(b"SSH-2.0-client\n") + 4 + 1001


@pytest.mark.parametrize(
    ("host", "port", "reason", "code"),
    [
        ("2130706433", 443, "reserved_address", 2),
        ("0x7f.1", 443, "reserved_address", 2),
        ("0177.0.0.1", 443, "reserved_address", 2),
        ("127.0.0.1", 443, "reserved_address", 2),
        ("::1", 443, "reserved_address", 2),
        ("::ffff:127.0.0.1", 443, "reserved_address", 2),
        ("rebind.test", 443, "reserved_address", 2),
        ("git.test", 2222, "port_not_allowed", 2),
        # no rule can allow it on 22: refused without a lookup (the CIDR rule covers
        # addresses, on 80 and 443: docs/policy.md#no-lookup-decides-nothing)
        ("unknown.test", 22, "default_deny", 2),
        ("evil.test/.git.test", 22, "bad_request", 1),
    ],
    ids=["decimal", "hex-short", "octal", "loopback", "v6-loopback", "v4-mapped", "rebinding",
         "port", "unknown-name", "slash"],
)  # fmt: skip
async def test_red_team_refused_with_reply_code(
    world: World, host: str, port: int, reason: str, code: int
) -> None:
    _reader, writer, reply = await socks_connect(world, host, port)
    writer.close()
    assert reply[:2] == bytes([5, code]), (host, reply)
    event = await world.audit.wait_for(reason=reason)
    assert (event["decision"] in ("block", "error"), event["mode"]) == (True, "socks5")
    assert event["socks_reply"] == code
    assert "addr" not in event


async def test_unsupported_command_and_address_type(world: World) -> None:
    for data, code, reason in (
        (socks5.serialize_request("git.test", world.ssh_port, cmd=3), 7, "command_not_supported"),
        (b"\x05\x01\x00\x05" + b"x" * 8, 8, "address_type_not_supported"),
    ):
        reader, writer = await asyncio.open_connection(*world.socks)
        writer.write(b"\x05\x01\x00" + data)
        got = await asyncio.wait_for(reader.read(-1), 5)
        writer.close()
        assert got[:4] == b"\x05\x00" + bytes([5, code]), got
        event = await world.audit.wait_for(reason=reason)
        assert (event["decision"], event["socks_reply"]) == ("error", code)


async def test_token_selects_client_and_wrong_token_refused() -> None:
    ssh_srv = await start_tcp(None, 0, ssh_like)
    ssh = port_of(ssh_srv)
    audit = MemoryAudit()
    settings = exempt(build_settings({"default": "deny"}, resolve=["git.test=127.0.0.1"]), ssh)
    agent = ClientSpec("agent-1", Policy(allow=[f"git.test:{ssh}"]), token="tok-1")
    settings = type(settings)(settings.policy, settings.guard, settings.resolve, (agent,))
    proxy = EgressProxy(settings, socks=["127.0.0.1:0"], audit=audit, require_auth=True)
    async with proxy:
        w = World(None, None, proxy, audit, ssh)  # type: ignore[arg-type]
        reader, writer, reply = await socks_connect(w, "git.test", ssh, ("agent-1", "tok-1"))
        assert reply[:2] == b"\x05\x00"
        assert await reader.readline() == b"SSH-2.0-egress-test\r\n"
        writer.close()
        event = await audit.wait_for(decision="allow")
        assert event["client_id"] == "agent-1"
        # wrong token: RFC 1929 failure status, audited, never the token itself
        r, wr = await asyncio.open_connection(*proxy.socks_addresses[0])
        wr.write(b"\x05\x01\x02\x01\x07agent-1\x05wrong")
        assert await asyncio.wait_for(r.read(-1), 5) == b"\x05\x02\x01\x01"
        wr.close()
        event = await audit.wait_for(reason="auth_failed")
        assert event["mode"] == "socks5"
        assert "wrong" not in str(event)
        # no username/password offered when it is required: 0xFF
        r, wr = await asyncio.open_connection(*proxy.socks_addresses[0])
        wr.write(b"\x05\x01\x00")
        assert await asyncio.wait_for(r.read(-1), 5) == b"\x05\xff"
        wr.close()
        await audit.wait_for(reason="auth_required")
    ssh_srv.close()


# --- TLS: SNI mismatch inside an allowed SOCKS5 CONNECT ----------------------------------


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    d = tmp_path_factory.mktemp("socks-tls")
    key, crt = str(d / "key.pem"), str(d / "crt.pem")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", key, "-out", crt, "-days", "2", "-subj", "/CN=tls.test",
         "-addext", "subjectAltName=DNS:tls.test,DNS:evil.test"],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    return crt, key


async def tls_roundtrip(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ctx: ssl.SSLContext, sni: str
) -> bytes:
    await writer.start_tls(ctx, server_hostname=sni)
    writer.write(b"hi")
    data = await asyncio.wait_for(reader.read(100), 5)
    if not data:
        raise ConnectionError("closed")
    return data


async def test_sni_mismatch_on_an_https_port_is_cut(cert: tuple[str, str]) -> None:
    """The TLS upstream listens on a loopback port; an `https://` rule makes its SNI checked
    as on 443 (docs/proxy.md#tls-sni-check)."""
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(*cert)

    async def tls_echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(b"tls-echo:" + await reader.read(100))
            await writer.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(tls_echo, sock=listen(None, "0.0.0.0", 0), ssl=server_ctx)
    tls_port = port_of(server)
    ctx = ssl.create_default_context(cafile=cert[0])
    try:
        async with serving(None, tls_port) as world:
            for sni, ok in (("tls.test", True), ("evil.test", False)):
                reader, writer, reply = await socks_connect(world, "tls.test", tls_port)
                assert reply[:2] == b"\x05\x00"
                if ok:
                    assert await tls_roundtrip(reader, writer, ctx, sni) == b"tls-echo:hi"
                else:
                    with pytest.raises(
                        (ConnectionError, ssl.SSLError, asyncio.IncompleteReadError)
                    ):
                        await tls_roundtrip(reader, writer, ctx, sni)
                writer.close()
            event = await world.audit.wait_for(reason="sni_mismatch")
            sni_seen = (event["decision"], event["sni"], event["host"])
            assert sni_seen == ("block", "evil.test", "tls.test")
            assert event["mode"] == "socks5"
            assert world.audit.find(decision="allow", host="tls.test", mode="socks5")
    finally:
        server.close()


@pytest.mark.userns
async def test_egress_serve_socks_flag(test_host: harness.TestHost, tmp_path: Path) -> None:
    """`egress serve --socks`: one `listening on HOST:PORT socks5` line after the HTTP ones,
    curl through it, and the record in the file log after SIGTERM."""
    import json
    import signal
    import sys

    origin = await start_origin(test_host, 80)
    log = tmp_path / "audit.jsonl"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "egress.cli", "serve", "--listen", "127.0.0.1:0",
        "--socks", "127.0.0.1:0", "--allow", "www.test:80", "--quiet",
        "--resolve", f"www.test={test_host.addr_ns}", "--audit-log", str(log),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        lines = [(await asyncio.wait_for(proc.stdout.readline(), 20)).decode().strip()
                 for _ in range(2)]  # fmt: skip
        assert lines[0].startswith("listening on 127.0.0.1:")
        assert not lines[0].endswith("socks5")
        assert lines[1].startswith("listening on 127.0.0.1:")
        assert lines[1].endswith(" socks5")
        socks = lines[1].split()[2]
        rc, out, err = await run("curl", "-sS", "--max-time", "10", "--socks5-hostname", socks,
                                 "http://www.test/via-serve")  # fmt: skip
        assert rc == 0, err
        assert "/via-serve" in out
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 20)
        await origin.close()
    assert proc.returncode == 0
    records = [json.loads(x) for x in log.read_text().splitlines()]
    found = [
        r
        for r in records
        if r.get("mode") == "socks5" and r.get("host") == "www.test" and "type" not in r
    ]
    assert found
    assert (found[0]["decision"], found[0]["rule"]) == ("allow", "www.test:80")


async def test_socks_with_workers_is_a_usage_error() -> None:
    import sys

    rc, _, err = await run(
        sys.executable,
        "-m",
        "egress.cli",
        "serve",
        "--socks",
        "127.0.0.1:0",
        "--workers",
        "2",
        "--quiet",
    )
    assert rc == 2
    assert "--socks" in err

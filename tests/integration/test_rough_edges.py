"""What new users hit first (issue "For the people who run it"), each against real clients.

Refused CONNECT reasons in the status line (urllib drops the body), ws:// refused with the
destination named, TLS sent to the plain-HTTP port, tunnel end states, `egress check
--client`, and `egress serve`'s stderr lines, token warning and shutdown summary. The proxy
tests' upstreams listen on loopback ports that the guard lets through (`proxykit.exempt`).
"""

from __future__ import annotations

import asyncio
import signal
import socket
import struct
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from egress.config import build_settings
from egress.proxy.server import EgressProxy

import harness
from proxykit import MemoryAudit, exempt, raw_exchange
from servers import echo, port_of, run, start_origin, start_tcp


@dataclass
class Scene:
    proxy: EgressProxy
    audit: MemoryAudit
    echo_port: int


@pytest.fixture
async def scene() -> AsyncIterator[Scene]:
    origin = await start_origin(None, 0)
    echo_srv = await start_tcp(None, 0, echo)
    web, echo_port = origin.port, port_of(echo_srv)
    settings = build_settings(
        {
            "allow": ["www.test", f"www.test:{web}", f"echo.test:{echo_port}"],
            "block": ["blocked.test"],
        },
        resolve=[
            f"www.test={origin.addr}",
            f"echo.test={origin.addr}",
            f"blocked.test={origin.addr}",
        ],
    )
    audit = MemoryAudit()
    try:
        async with EgressProxy(exempt(settings, web, echo_port), audit=audit) as proxy:
            yield Scene(proxy, audit, echo_port)
    finally:
        echo_srv.close()
        await origin.close()


def urllib_get(proxy_url: str, url: str) -> str:
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({"http": proxy_url, "https": proxy_url})
    )
    try:
        opener.open(url, timeout=5)
    except (urllib.error.URLError, OSError) as exc:
        return str(exc)
    return "ok"


async def test_refused_connect_names_the_reason_in_the_status_line(scene: Scene) -> None:
    # urllib (like requests, httpx, pip) reports only the CONNECT status line
    shown = await asyncio.to_thread(urllib_get, scene.proxy.url, "https://blocked.test/")
    assert "403 Forbidden (egress: block_rule)" in shown
    host, port = scene.proxy.addresses[0]
    reply = await raw_exchange(host, port, b"CONNECT blocked.test:443 HTTP/1.1\r\n\r\n")
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 403 Forbidden (egress: block_rule)\r\n")
    assert b"Proxy-Status: egress; error=http_request_denied" in head
    assert body == b"egress: 403 block_rule: blocked by rule 'blocked.test'\n"


async def test_websocket_over_plain_http_is_refused_naming_the_destination(scene: Scene) -> None:
    url = f"ws://echo.test:{scene.echo_port}/chat"
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.WSServerHandshakeError) as info:
            await session.ws_connect(url, proxy=scene.proxy.url)
    assert info.value.status == 400
    record = await scene.audit.wait_for(method="GET", host="echo.test")
    assert record["port"] == scene.echo_port
    assert record["reason"] == "bad_request"
    assert "WebSocket over plain HTTP" in str(record["detail"])
    # the default port of ws:// is 80, and the body says what to do
    host, port = scene.proxy.addresses[0]
    reply = await raw_exchange(
        host,
        port,
        b"GET ws://www.test/x HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
    )
    assert reply.startswith(b"HTTP/1.1 400 Bad Request (egress: bad_request)")
    assert b"use wss://" in reply
    assert scene.audit.find(host="www.test", port=80, reason="bad_request")


async def test_tls_to_the_plain_port_is_named(scene: Scene) -> None:
    rc, _, err = await run(
        "curl",
        "-sS",
        "--max-time",
        "5",
        "-x",
        scene.proxy.url.replace("http:", "https:"),
        "http://www.test/",
    )
    assert rc != 0, err
    record = await scene.audit.wait_for(reason="bad_request")
    assert "TLS to a plain-HTTP proxy port" in str(record["detail"])


def open_tunnel(host: str, port: int, echo_port: int) -> socket.socket:
    sock = socket.create_connection((host, port), timeout=5)
    sock.sendall(f"CONNECT echo.test:{echo_port} HTTP/1.1\r\n\r\n".encode())
    got = b""
    while b"\r\n\r\n" not in got:
        got += sock.recv(4096)
    assert got.startswith(b"HTTP/1.1 200")
    return sock


async def test_tunnel_end_states_mean_what_they_say(scene: Scene) -> None:
    def clean() -> None:
        sock = open_tunnel(host, port, scene.echo_port)
        with sock:
            sock.sendall(b"ping")
            assert sock.recv(4) == b"ping"
            sock.shutdown(socket.SHUT_WR)
            assert sock.recv(10) == b""  # the echo server closes its side in turn

    def closed_with_unread_bytes() -> None:
        sock = open_tunnel(host, port, scene.echo_port)
        sock.sendall(b"ping")
        assert sock.recv(4) == b"ping"
        sock.sendall(b"more")  # its echo stays unread: the close becomes a reset
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()

    host, port = scene.proxy.addresses[0]
    await asyncio.to_thread(clean)
    first = await scene.audit.wait_for(method="CONNECT")
    assert first["end"] == "eof"
    await asyncio.to_thread(closed_with_unread_bytes)
    async with asyncio.timeout(5):
        while len(scene.audit.find(method="CONNECT")) < 2:
            scene.audit.changed.clear()
            await scene.audit.changed.wait()
    second = scene.audit.find(method="CONNECT")[1]
    assert second["end"] == "client_closed"
    assert second["decision"] == "allow"
    assert second["bytes_up"] >= 4


async def test_check_honours_a_client_policy(tmp_path: Path) -> None:
    policy = tmp_path / "p.toml"
    policy.write_text(
        'allow = ["a.test"]\nblock = ["evil.test"]\n'
        '[clients.sb]\ntoken = "t"\nallow = ["b.test", "evil.test"]\n'
    )
    egress = (sys.executable, "-m", "egress.cli", "check", "--policy", str(policy))
    rc, out, _ = await run(*egress, "b.test")
    assert rc == 1
    assert out.startswith("block b.test")
    rc, out, _ = await run(*egress, "--client", "sb", "b.test", "evil.test")
    assert rc == 1
    lines = out.splitlines()
    assert lines[0].startswith("allow b.test")
    assert lines[1].startswith("block evil.test block_rule")  # top-level blocks still apply
    rc, _, err = await run(*egress, "--client", "nobody", "b.test")
    assert rc == 2
    assert "no client 'nobody'" in err
    assert "sb" in err


@pytest.mark.userns
async def test_serve_prints_request_lines_warns_about_tokens_and_summarizes(
    test_host: harness.TestHost, tmp_path: Path
) -> None:
    origin = await start_origin(test_host, 80)
    policy = tmp_path / "p.toml"
    policy.write_text('allow = ["www.test"]\n[clients.sb]\ntoken = "t"\nallow = ["www.test"]\n')
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "egress.cli",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--policy",
        str(policy),
        "--resolve",
        f"www.test={test_host.addr_ns}",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode().strip()
        url = "http://" + line.removeprefix("listening on ")
        for target in ("http://www.test/", "http://other.test/"):
            await run("curl", "-sS", "-o", "/dev/null", "--max-time", "5", "-x", url, target)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 15) == 0
        err = (await proc.stderr.read()).decode()
        rest = (await proc.stdout.read()).decode()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await origin.close()
    assert rest == ""  # stdout keeps only the `listening on` line
    assert "clients sb have tokens but --require-auth is off" in err
    assert "egress: allow GET www.test:80 allow_rule 200" in err
    assert "egress: block GET other.test:80 default_deny 403" in err
    assert "egress serve: 2 requests: 1 allow, 1 block (default_deny 1)" in err

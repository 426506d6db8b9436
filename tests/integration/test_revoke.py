"""Tunnels do not outlive a tightened policy (issue 19 item 5, docs/policy.md#live-policy-changes).

Repro: after `update_execution` forbade a host, open SOCKS, CONNECT and transparent tunnels to
it kept relaying. Now a policy change re-judges every open tunnel of that client with the
address it was dialed at, and closes those no longer allowed, recorded `end: revoked`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import struct
import sys

import pytest

from egress import EgressProxy, Policy, prepare_execution, release_execution, update_execution
from egress.config import ClientSpec, build_settings

from proxykit import MemoryAudit, client_hello, exempt
from servers import echo, port_of, start_tcp

AUTH = "Basic " + base64.b64encode(b"sb:tok").decode()


async def _connect_tunnel(
    host: str, port: int, echo_port: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(
        f"CONNECT echo.test:{echo_port} HTTP/1.1\r\nHost: echo.test:{echo_port}\r\n"
        f"Proxy-Authorization: {AUTH}\r\n\r\n".encode()
    )
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert head.startswith(b"HTTP/1.1 200"), head
    return reader, writer


async def _socks_tunnel(
    host: str, port: int, echo_port: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"\x05\x01\x02")
    assert await reader.readexactly(2) == b"\x05\x02"
    writer.write(b"\x01\x02sb\x03tok")
    assert await reader.readexactly(2) == b"\x01\x00"
    name = b"echo.test"
    writer.write(b"\x05\x01\x00\x03" + bytes((len(name),)) + name + struct.pack("!H", echo_port))
    reply = await asyncio.wait_for(reader.readexactly(10), 10)
    assert reply[1] == 0, reply
    return reader, writer


async def _echoes(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"ping\n")
    assert await asyncio.wait_for(reader.readexactly(5), 10) == b"ping\n"


async def test_set_client_policy_closes_connect_and_socks_tunnels() -> None:
    server = await start_tcp(None, 0, echo)  # on loopback: the guard lets its port through
    port = port_of(server)
    echo_rule = f"echo.test:{port}"
    audit = MemoryAudit()
    settings = exempt(build_settings({}, resolve=["echo.test=127.0.0.1"]), port)
    try:
        async with EgressProxy(settings, socks=["127.0.0.1:0"], audit=audit) as proxy:
            proxy.add_client(ClientSpec("sb", Policy(allow=[echo_rule]), token="tok"))
            proxy.add_client(ClientSpec("other", Policy(allow=[echo_rule]), token="o"))
            tunnels = [
                await _connect_tunnel(*proxy.addresses[0], port),
                await _socks_tunnel(*proxy.socks_addresses[0], port),
            ]
            for reader, writer in tunnels:
                await _echoes(reader, writer)
            # another client's policy change leaves them alone
            proxy.set_client_policy("other", Policy())
            await _echoes(*tunnels[0])
            proxy.set_client_policy("sb", Policy(allow=["www.test"]))
            for reader, _ in tunnels:
                assert await asyncio.wait_for(reader.read(), 10) == b""  # closed by the proxy
            for mode in (None, "socks5"):
                rec = await audit.wait_for(host="echo.test", end="revoked", mode=mode)
                assert (rec["client_id"], rec["decision"]) == ("sb", "allow")
                assert int(rec["bytes_up"]) >= 5  # type: ignore[call-overload]
            for _, writer in tunnels:
                writer.close()
    finally:
        server.close()


@pytest.mark.netns
async def test_update_execution_closes_a_transparent_tunnel(test_host_factory: object) -> None:
    sandbox = test_host_factory()  # type: ignore[operator]
    upstream = test_host_factory()  # type: ignore[operator]
    server = await start_tcp(upstream, 7000, echo)
    audit = MemoryAudit()
    # the agent: a raw TCP client that echoes once, then waits for the connection to end
    script = (
        "import socket, sys, time\n"
        f"s = socket.create_connection(({upstream.addr_ns!r}, 7000), timeout=30)\n"
        "s.sendall(b'ping\\n'); assert s.recv(5) == b'ping\\n'\n"
        "print('open', flush=True)\n"
        "t = time.monotonic(); data = s.recv(100)\n"
        "print('closed', repr(data), flush=True)\n"
    )
    try:
        async with EgressProxy(build_settings({}), audit=audit) as proxy:
            policy = Policy(allow=[f"{upstream.addr_ns}:7000"])
            execution = await prepare_execution(sandbox.ns, policy, proxy, transparent=True)
            try:
                agent = await asyncio.create_subprocess_exec(
                    "ip", "netns", "exec", sandbox.ns, sys.executable, "-c", script,
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                )  # fmt: skip
                assert agent.stdout is not None
                line = await asyncio.wait_for(agent.stdout.readline(), 20)
                assert line == b"open\n", (line, await agent.stderr.read())  # type: ignore[union-attr]
                update_execution(proxy, execution, Policy())
                line = await asyncio.wait_for(agent.stdout.readline(), 20)
                assert line.startswith(b"closed"), line
                await agent.wait()
                rec = await audit.wait_for(end="revoked", mode="transparent")
                assert rec["client_id"] == execution.client_id
            finally:
                await release_execution(proxy, execution, restore=True)
    finally:
        server.close()


@pytest.mark.parametrize("callbacks", [True, False], ids=["callback-driver", "coroutine"])
async def test_a_tunnel_judged_before_the_change_is_judged_again_before_it_relays(
    callbacks: bool,
) -> None:
    """A CONNECT admitted under the old policy that is still waiting for its ClientHello
    (its SNI check) when the policy changes: the change finds no relay to cut yet, so it is
    judged again before its first byte is relayed, and cut (`end: revoked`, nothing sent).
    Both drivers: the callback driver (a CONNECT's default) and the coroutine."""
    received = bytearray()

    async def sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                received.extend(data)
        writer.close()

    server = await start_tcp(None, 0, sink)
    port = port_of(server)
    audit = MemoryAudit()
    settings = exempt(build_settings({}, resolve=["echo.test=127.0.0.1"]), port)
    try:
        async with EgressProxy(settings, audit=audit) as proxy:
            proxy.steps.fast_path = callbacks
            # an https:// rule: the proxy reads the ClientHello before it relays
            rule = f"https://echo.test:{port}"
            proxy.add_client(ClientSpec("sb", Policy(allow=[rule]), token="tok"))
            reader, writer = await _connect_tunnel(*proxy.addresses[0], port)
            proxy.set_client_policy("sb", Policy(allow=["www.test"]))
            writer.write(client_hello("echo.test"))
            assert await asyncio.wait_for(reader.read(), 10) == b""
            rec = await audit.wait_for(host="echo.test", end="revoked")
            assert (rec["client_id"], rec["decision"], rec["bytes_up"]) == ("sb", "allow", 0)
            assert rec["sni"] == "echo.test"
            writer.close()
        assert bytes(received) == b""  # not one byte reached the upstream
    finally:
        server.close()

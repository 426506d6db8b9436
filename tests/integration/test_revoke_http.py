"""Kept-alive plain HTTP does not outlive a tightened policy either (issue 19 item 5,
docs/policy.md#live-policy-changes).

Repro: after a policy change forbade a host, a client holding an HTTP/1.1 keep-alive
connection kept it (and the proxy kept the pooled upstream connection to that host), and a
response being relayed from the host - a long chunked stream - or a request body being sent
to it went on under the old decision. Now the next request on a kept-alive connection is
judged by the new policy; an idle kept-alive connection (and pooled upstream) whose last
destination the new policy forbids is closed, recorded `end: revoked`; a request or response
in flight to such a destination is cut, its own record `end: revoked`.

Real sockets and real clients (raw HTTP/1.1, aiohttp) through a real proxy to an origin on a
loopback port the guard lets through (`proxykit.exempt`: no root needed,
docs/testing.md#which-tests-need-root); the policy change is synchronous, so nothing here
waits on time except to fail.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
import pytest

from egress import EgressProxy, Policy
from egress.config import ClientSpec, Settings, build_settings

from proxykit import MemoryAudit, exempt
from servers import port_of, request_paths, start_tcp

AUTH = "Basic " + base64.b64encode(b"sb:tok").decode()
NAMES = ("a.test", "b.test", "gone.test")


@dataclass
class Origin:
    """A hand-written HTTP/1.1 origin that shows what reached it, connection by connection.

    `/stream`: a chunked response, one chunk at once and the next only when `go` is set;
    `/upload`: reads a chunked request body, `got_first` once its first chunk arrived, and
    everything it received until EOF is kept in `uploaded`; anything else: `200 ok`, kept
    alive. `closed` is set each time the proxy closes one of its connections to it."""

    go: asyncio.Event = field(default_factory=asyncio.Event)
    got_first: asyncio.Event = field(default_factory=asyncio.Event)
    streamed: asyncio.Event = field(default_factory=asyncio.Event)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    open: int = 0
    uploaded: bytearray = field(default_factory=bytearray)
    stream_write_ok: bool | None = None

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open += 1
        try:
            async for path in request_paths(reader):
                if path == "/stream":
                    await self._stream(writer)
                    return
                if path == "/upload":
                    await self._upload(reader)
                    return
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
        finally:
            self.open -= 1
            self.closed.set()
            writer.close()

    async def _stream(self, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        await self.go.wait()
        try:
            writer.write(b"6\r\nSECOND\r\n0\r\n\r\n")
            await writer.drain()
            self.stream_write_ok = True
        except ConnectionError:
            self.stream_write_ok = False
        self.streamed.set()

    async def _upload(self, reader: asyncio.StreamReader) -> None:
        try:
            while data := await reader.read(65536):
                self.uploaded += data
                if b"first" in self.uploaded:
                    self.got_first.set()
        except ConnectionError:
            pass


def _get(port: int, host: str, path: str = "/") -> bytes:
    return (
        f"GET http://{host}:{port}{path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Proxy-Authorization: {AUTH}\r\n\r\n"
    ).encode()


async def _ok(reader: asyncio.StreamReader) -> None:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert head.startswith(b"HTTP/1.1 200"), head
    assert await asyncio.wait_for(reader.readexactly(2), 10) == b"ok"


async def _closed(reader: asyncio.StreamReader) -> bytes:
    """What is left to read until the proxy closes the connection (fails after 10 s)."""
    try:
        return await asyncio.wait_for(reader.read(), 10)
    except ConnectionResetError:
        return b""


def _settings(port: int, *allow: str) -> Settings:
    """Every test name resolves to the origin's loopback address, let through on its port."""
    pins = [f"{n}=127.0.0.1" for n in NAMES]
    return exempt(build_settings({}, allow=list(allow), resolve=pins), port)


@dataclass
class Site:
    proxy: EgressProxy
    origin: Origin
    audit: MemoryAudit
    port: int


@pytest.fixture
async def site() -> AsyncIterator[Site]:
    """A proxy with client `sb` (token `tok`) allowed every test name, and the origin."""
    origin = Origin()
    server = await start_tcp(None, 0, origin.serve)
    port = port_of(server)
    audit = MemoryAudit()
    proxy = EgressProxy(_settings(port), audit=audit)
    await proxy.start()
    try:
        proxy.add_client(
            ClientSpec("sb", Policy(allow=[f"{n}:{port}" for n in NAMES]), token="tok")
        )
        yield Site(proxy, origin, audit, port)
    finally:
        await proxy.stop()
        server.close()


async def test_next_request_on_a_kept_alive_connection_is_judged_anew(site: Site) -> None:
    """Raw HTTP/1.1 and aiohttp: after the change, the next request on the same kept-alive
    connection (a pooled upstream to the same address ready, the callback fast path's case)
    to a host just forbidden is refused; one to a host still allowed goes through."""
    proxy, audit, port = site.proxy, site.audit, site.port
    host, lport = proxy.addresses[0]
    reader, writer = await asyncio.open_connection(host, lport)
    for name in ("gone.test", "a.test", "gone.test", "a.test"):
        writer.write(_get(port, name))
        await _ok(reader)
    proxy.set_client_policy("sb", Policy(allow=[f"a.test:{port}"]))
    writer.write(_get(port, "gone.test"))
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert head.startswith(b"HTTP/1.1 403"), head  # on the same connection
    rec = await audit.wait_for(host="gone.test", decision="block")
    assert rec["client_id"] == "sb"
    writer.close()

    # aiohttp, on a listener bound to its client (as a sandbox's own listener is)
    both = Policy(allow=[f"{n}:{port}" for n in ("a.test", "b.test")])
    bound = await proxy.add_listener("127.0.0.1:0", client=ClientSpec("agent", both))
    url = f"http://{bound.host}:{bound.port}"
    conn = aiohttp.TCPConnector(limit=1)
    async with aiohttp.ClientSession(connector=conn) as session:
        for name in ("b.test", "a.test"):
            async with session.get(f"http://{name}:{port}/", proxy=url) as resp:
                assert resp.status == 200
                assert await resp.read() == b"ok"
        proxy.set_client_policy("agent", Policy(allow=[f"a.test:{port}"]))
        async with session.get(f"http://b.test:{port}/", proxy=url) as resp:
            assert resp.status == 403
        async with session.get(f"http://a.test:{port}/", proxy=url) as resp:
            assert resp.status == 200
    rec = await audit.wait_for(host="b.test", decision="block", method="GET")
    assert rec["client_id"] == "agent"
    # aiohttp keeps one connection per destination: b.test's, idle, was closed by the
    # change (recorded), and aiohttp's retry on a new one was refused; a.test's stayed
    b_conns = [e["client"] for e in audit.find(host="b.test", method="GET")]
    assert len(b_conns) == 2
    assert b_conns[0] != b_conns[1]
    gone = audit.find(host="b.test", end="revoked")
    assert [e["client"] for e in gone] == [b_conns[0]]
    assert len({e["client"] for e in audit.find(host="a.test", client_id="agent")}) == 1


async def test_an_idle_kept_alive_connection_and_its_pooled_upstream_are_closed(
    site: Site,
) -> None:
    """Between requests, a client connection whose last destination is now forbidden is
    closed, and the pooled upstream connection kept for it too: one record, `end: revoked`.
    Another client's change, or one that still allows the host, closes nothing."""
    proxy, origin, audit, port = site.proxy, site.origin, site.audit, site.port
    proxy.add_client(ClientSpec("other", Policy(allow=[f"a.test:{port}"]), token="o"))
    reader, writer = await asyncio.open_connection(*proxy.addresses[0])
    writer.write(_get(port, "gone.test"))
    await _ok(reader)
    assert origin.open == 1  # the pooled upstream
    origin.closed.clear()
    proxy.set_client_policy("other", Policy())  # not its client
    proxy.set_client_policy("sb", Policy(allow=[f"gone.test:{port}"]))  # still allowed
    writer.write(_get(port, "gone.test"))
    await _ok(reader)
    assert not audit.find(end="revoked")
    proxy.set_client_policy("sb", Policy(allow=[f"a.test:{port}"]))
    assert await _closed(reader) == b""
    await asyncio.wait_for(origin.closed.wait(), 10)
    assert origin.open == 0
    rec = await audit.wait_for(end="revoked")
    assert rec["method"] == "-"
    assert (rec["host"], rec["port"], rec["client_id"]) == ("gone.test", port, "sb")
    assert (rec["decision"], rec["reason"]) == ("block", "default_deny")
    assert rec["addr"] == "127.0.0.1"
    assert rec["listener"] == "{}:{}".format(*proxy.addresses[0])
    assert rec["mode"] == "http"
    assert len(audit.find(end="revoked")) == 1
    writer.close()


async def test_a_pooled_upstream_is_closed_after_its_client_left() -> None:
    """The client already went away; the upstream connection the proxy pooled for the host
    it last reached is closed and recorded (`replace_settings`, what SIGHUP uses)."""
    audit = MemoryAudit()
    origin = Origin()
    server = await start_tcp(None, 0, origin.serve)
    port = port_of(server)
    try:
        async with EgressProxy(_settings(port, f"gone.test:{port}"), audit=audit) as proxy:
            reader, writer = await asyncio.open_connection(*proxy.addresses[0])
            writer.write(f"GET http://gone.test:{port}/ HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            await _ok(reader)
            writer.close()
            await audit.wait_for(host="gone.test", decision="allow")
            assert origin.open == 1
            origin.closed.clear()
            await proxy.replace_settings(_settings(port), source="sighup")
            await asyncio.wait_for(origin.closed.wait(), 10)
            assert origin.open == 0
            rec = await audit.wait_for(end="revoked")
            assert (rec["method"], rec["host"], rec["client_id"]) == ("-", "gone.test", None)
            assert rec["decision"] == "block"
    finally:
        server.close()


@pytest.mark.parametrize("after_another", [False, True], ids=["first", "kept-alive"])
async def test_a_response_in_flight_is_cut(site: Site, after_another: bool) -> None:
    """A chunked response being relayed from a host just forbidden is cut: its next chunk
    never reaches the client, its record says `end: revoked`. `kept-alive`: the request
    follows another on the same connection (a pooled upstream: the callback fast path)."""
    proxy, origin, audit, port = site.proxy, site.origin, site.audit, site.port
    reader, writer = await asyncio.open_connection(*proxy.addresses[0])
    if after_another:
        writer.write(_get(port, "gone.test"))
        await _ok(reader)
    writer.write(_get(port, "gone.test", "/stream"))
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert head.startswith(b"HTTP/1.1 200"), head
    assert await asyncio.wait_for(reader.readuntil(b"first\r\n"), 10) == b"5\r\nfirst\r\n"
    proxy.set_client_policy("sb", Policy(allow=[f"a.test:{port}"]))
    origin.go.set()
    assert b"SECOND" not in await _closed(reader)
    rec = await audit.wait_for(path="/stream")
    assert (rec["end"], rec["decision"], rec["status"]) == ("revoked", "allow", 200)
    assert rec["client_id"] == "sb"
    assert not audit.find(end="revoked", method="-")  # the exchange's own record says it
    writer.close()


async def test_a_request_body_in_flight_is_cut(site: Site) -> None:
    """A chunked upload to a host just forbidden is cut: the rest of its body never reaches
    the host, its record says `end: revoked`."""
    proxy, origin, audit, port = site.proxy, site.origin, site.audit, site.port
    reader, writer = await asyncio.open_connection(*proxy.addresses[0])
    writer.write(
        f"POST http://gone.test:{port}/upload HTTP/1.1\r\nHost: gone.test:{port}\r\n"
        f"Proxy-Authorization: {AUTH}\r\nTransfer-Encoding: chunked\r\n\r\n"
        "5\r\nfirst\r\n".encode()
    )
    await asyncio.wait_for(origin.got_first.wait(), 10)
    proxy.set_client_policy("sb", Policy(allow=[f"a.test:{port}"]))
    await asyncio.wait_for(origin.closed.wait(), 10)  # cut: the origin saw its end
    try:
        writer.write(b"6\r\nSECOND\r\n0\r\n\r\n")
        await writer.drain()
    except ConnectionError:
        pass
    assert b"SECOND" not in origin.uploaded
    assert await _closed(reader) == b""  # no answer: the exchange was cut, not refused
    rec = await audit.wait_for(path="/upload")
    assert (rec["end"], rec["decision"], rec["client_id"]) == ("revoked", "allow", "sb")
    assert int(rec["bytes_up"]) >= 5  # type: ignore[call-overload]
    writer.close()

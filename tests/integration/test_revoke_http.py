"""Kept-alive plain HTTP does not outlive a tightened policy either (issue 19 item 5,
docs/policy.md#live-policy-changes).

Repro: after a policy change forbade a host, a client holding an HTTP/1.1 keep-alive
connection kept it (and the proxy kept the pooled upstream connection to that host), and a
response being relayed from the host - a long chunked stream - or a request body being sent
to it went on under the old decision. Now the next request on a kept-alive connection is
judged by the new policy; an idle kept-alive connection (and pooled upstream) whose last
destination the new policy forbids is closed, recorded `end: revoked`; a request or response
in flight to such a destination is cut, its own record `end: revoked`.

Real sockets and real clients (raw HTTP/1.1, aiohttp) through a real proxy to an origin in a
test namespace; the policy change is synchronous, so nothing here waits on time except to
fail.
"""

from __future__ import annotations

import asyncio
import base64
from dataclasses import dataclass, field

import aiohttp
import pytest

from egress import EgressProxy, Policy
from egress.config import ClientSpec, build_settings

import harness
from proxykit import MemoryAudit
from servers import start_tcp

pytestmark = pytest.mark.netns

AUTH = "Basic " + base64.b64encode(b"sb:tok").decode()
PORT = 7000


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
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                path = head.split(b" ", 2)[1]
                if path == b"/stream":
                    await self._stream(writer)
                    return
                if path == b"/upload":
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


def _get(host: str, path: str = "/") -> bytes:
    return (
        f"GET http://{host}:{PORT}{path} HTTP/1.1\r\nHost: {host}:{PORT}\r\n"
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


def _settings(test_host: harness.TestHost) -> object:
    names = ("a.test", "b.test", "gone.test")
    return build_settings({}, resolve=[f"{n}={test_host.addr_ns}" for n in names])


async def _proxy_with_origin(
    test_host: harness.TestHost, audit: MemoryAudit
) -> tuple[EgressProxy, Origin, asyncio.Server]:
    origin = Origin()
    server = await start_tcp(test_host, PORT, origin.serve)
    proxy = EgressProxy(_settings(test_host), audit=audit)  # type: ignore[arg-type]
    await proxy.start()
    every = [f"{n}:{PORT}" for n in ("a.test", "b.test", "gone.test")]
    proxy.add_client(ClientSpec("sb", Policy(allow=every), token="tok"))
    return proxy, origin, server


async def test_next_request_on_a_kept_alive_connection_is_judged_anew(
    test_host: harness.TestHost,
) -> None:
    """Raw HTTP/1.1 and aiohttp: after the change, the next request on the same kept-alive
    connection (a pooled upstream to the same address ready, the callback fast path's case)
    to a host just forbidden is refused; one to a host still allowed goes through."""
    audit = MemoryAudit()
    proxy, _, server = await _proxy_with_origin(test_host, audit)
    try:
        host, port = proxy.addresses[0]
        reader, writer = await asyncio.open_connection(host, port)
        for name in ("gone.test", "a.test", "gone.test", "a.test"):
            writer.write(_get(name))
            await _ok(reader)
        proxy.set_client_policy("sb", Policy(allow=[f"a.test:{PORT}"]))
        writer.write(_get("gone.test"))
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 403"), head  # on the same connection
        rec = await audit.wait_for(host="gone.test", decision="block")
        assert rec["client_id"] == "sb"
        writer.close()

        # aiohttp, on a listener bound to its client (as a sandbox's own listener is)
        both = Policy(allow=[f"{n}:{PORT}" for n in ("a.test", "b.test")])
        bound = await proxy.add_listener("127.0.0.1:0", client=ClientSpec("agent", both))
        url = f"http://{bound.host}:{bound.port}"
        conn = aiohttp.TCPConnector(limit=1)
        async with aiohttp.ClientSession(connector=conn) as session:
            for name in ("b.test", "a.test"):
                async with session.get(f"http://{name}:{PORT}/", proxy=url) as resp:
                    assert resp.status == 200
                    assert await resp.read() == b"ok"
            proxy.set_client_policy("agent", Policy(allow=[f"a.test:{PORT}"]))
            async with session.get(f"http://b.test:{PORT}/", proxy=url) as resp:
                assert resp.status == 403
            async with session.get(f"http://a.test:{PORT}/", proxy=url) as resp:
                assert resp.status == 200
        rec = await audit.wait_for(host="b.test", decision="block")
        assert rec["client_id"] == "agent"
        # aiohttp keeps one connection per destination: b.test's, idle, was closed by the
        # change (recorded), and aiohttp's retry on a new one was refused; a.test's stayed
        b_conns = [e["client"] for e in audit.find(host="b.test", method="GET")]
        assert len(b_conns) == 2
        assert b_conns[0] != b_conns[1]
        gone = audit.find(host="b.test", end="revoked")
        assert [e["client"] for e in gone] == [b_conns[0]]
        assert len({e["client"] for e in audit.find(host="a.test", client_id="agent")}) == 1
    finally:
        await proxy.stop()
        server.close()


async def test_an_idle_kept_alive_connection_and_its_pooled_upstream_are_closed(
    test_host: harness.TestHost,
) -> None:
    """Between requests, a client connection whose last destination is now forbidden is
    closed, and the pooled upstream connection kept for it too: one record, `end: revoked`.
    Another client's change, or one that still allows the host, closes nothing."""
    audit = MemoryAudit()
    proxy, origin, server = await _proxy_with_origin(test_host, audit)
    try:
        proxy.add_client(ClientSpec("other", Policy(allow=[f"a.test:{PORT}"]), token="o"))
        reader, writer = await asyncio.open_connection(*proxy.addresses[0])
        writer.write(_get("gone.test"))
        await _ok(reader)
        assert origin.open == 1  # the pooled upstream
        origin.closed.clear()
        proxy.set_client_policy("other", Policy())  # not its client
        proxy.set_client_policy("sb", Policy(allow=[f"gone.test:{PORT}"]))  # still allowed
        writer.write(_get("gone.test"))
        await _ok(reader)
        assert not audit.find(end="revoked")
        proxy.set_client_policy("sb", Policy(allow=[f"a.test:{PORT}"]))
        assert await _closed(reader) == b""
        await asyncio.wait_for(origin.closed.wait(), 10)
        assert origin.open == 0
        rec = await audit.wait_for(end="revoked")
        assert rec["method"] == "-"
        assert (rec["host"], rec["port"], rec["client_id"]) == ("gone.test", PORT, "sb")
        assert (rec["decision"], rec["reason"]) == ("block", "default_deny")
        assert rec["addr"] == test_host.addr_ns
        assert rec["listener"] == "{}:{}".format(*proxy.addresses[0])
        assert rec["mode"] == "http"
        assert len(audit.find(end="revoked")) == 1
        writer.close()
    finally:
        await proxy.stop()
        server.close()


async def test_a_pooled_upstream_is_closed_after_its_client_left(
    test_host: harness.TestHost,
) -> None:
    """The client already went away; the upstream connection the proxy pooled for the host
    it last reached is closed and recorded (`replace_settings`, what SIGHUP uses)."""
    audit = MemoryAudit()
    settings = build_settings(
        {}, allow=[f"gone.test:{PORT}"], resolve=[f"gone.test={test_host.addr_ns}"]
    )
    origin = Origin()
    server = await start_tcp(test_host, PORT, origin.serve)
    try:
        async with EgressProxy(settings, audit=audit) as proxy:
            reader, writer = await asyncio.open_connection(*proxy.addresses[0])
            writer.write(f"GET http://gone.test:{PORT}/ HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            await _ok(reader)
            writer.close()
            await audit.wait_for(host="gone.test", decision="allow")
            assert origin.open == 1
            origin.closed.clear()
            await proxy.replace_settings(
                build_settings({}, resolve=[f"gone.test={test_host.addr_ns}"]), source="sighup"
            )
            await asyncio.wait_for(origin.closed.wait(), 10)
            assert origin.open == 0
            rec = await audit.wait_for(end="revoked")
            assert (rec["method"], rec["host"], rec["client_id"]) == ("-", "gone.test", None)
            assert rec["decision"] == "block"
    finally:
        server.close()


@pytest.mark.parametrize("after_another", [False, True], ids=["first", "kept-alive"])
async def test_a_response_in_flight_is_cut(
    test_host: harness.TestHost, after_another: bool
) -> None:
    """A chunked response being relayed from a host just forbidden is cut: its next chunk
    never reaches the client, its record says `end: revoked`. `kept-alive`: the request
    follows another on the same connection (a pooled upstream: the callback fast path)."""
    audit = MemoryAudit()
    proxy, origin, server = await _proxy_with_origin(test_host, audit)
    try:
        reader, writer = await asyncio.open_connection(*proxy.addresses[0])
        if after_another:
            writer.write(_get("gone.test"))
            await _ok(reader)
        writer.write(_get("gone.test", "/stream"))
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 200"), head
        assert await asyncio.wait_for(reader.readuntil(b"first\r\n"), 10) == b"5\r\nfirst\r\n"
        proxy.set_client_policy("sb", Policy(allow=[f"a.test:{PORT}"]))
        origin.go.set()
        assert b"SECOND" not in await _closed(reader)
        rec = await audit.wait_for(path="/stream")
        assert (rec["end"], rec["decision"], rec["status"]) == ("revoked", "allow", 200)
        assert rec["client_id"] == "sb"
        assert not audit.find(end="revoked", method="-")  # the exchange's own record says it
        writer.close()
    finally:
        await proxy.stop()
        server.close()


async def test_a_request_body_in_flight_is_cut(test_host: harness.TestHost) -> None:
    """A chunked upload to a host just forbidden is cut: the rest of its body never reaches
    the host, its record says `end: revoked`."""
    audit = MemoryAudit()
    proxy, origin, server = await _proxy_with_origin(test_host, audit)
    try:
        reader, writer = await asyncio.open_connection(*proxy.addresses[0])
        writer.write(
            f"POST http://gone.test:{PORT}/upload HTTP/1.1\r\nHost: gone.test:{PORT}\r\n"
            f"Proxy-Authorization: {AUTH}\r\nTransfer-Encoding: chunked\r\n\r\n"
            "5\r\nfirst\r\n".encode()
        )
        await asyncio.wait_for(origin.got_first.wait(), 10)
        proxy.set_client_policy("sb", Policy(allow=[f"a.test:{PORT}"]))
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
    finally:
        await proxy.stop()
        server.close()

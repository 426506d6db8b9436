"""How an exchange the client abandoned, or the proxy cut, is recorded
(docs/audit-log.md#end-values).

An upload to an allowed host whose client closed mid-body, after its head and 5 MB of its
body reached the upstream, was recorded `error`/`bad_request`/400 with no `rule` and no
`bytes_up` (OCSF then said Denied, and `filter --decision allow` hid it). It is the allowed
exchange, ended `client_closed`, with its rule and the bytes sent. No root: the upstream
listens on a loopback port the guard lets through (`proxykit.exempt`).
"""

from __future__ import annotations

import asyncio
import socket
import struct

import pytest

from egress.config import build_settings
from egress.proxy.server import EgressProxy, Limits

from proxykit import MemoryAudit, exempt, read_response
from servers import port_of

SENT = 5 * 1024 * 1024


async def test_an_upload_the_client_abandons_is_an_allowed_exchange_ended_client_closed() -> None:
    received = 0
    got_all = asyncio.Event()

    async def sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """An upstream that reads the body and answers only once it is whole."""
        nonlocal received
        await reader.readuntil(b"\r\n\r\n")
        while data := await reader.read(65536):
            received += len(data)
            if received >= SENT:
                got_all.set()
        writer.close()

    server = await asyncio.start_server(sink, "127.0.0.1", 0)
    port = port_of(server)
    site = f"upload.test:{port}"
    audit = MemoryAudit()
    settings = exempt(build_settings({"allow": [site]}, resolve=["upload.test=127.0.0.1"]), port)
    async with EgressProxy(settings, audit=audit) as proxy:
        _, writer = await asyncio.open_connection(*proxy.addresses[0])
        head = (
            f"POST http://{site}/upload HTTP/1.1\r\nHost: {site}\r\n"
            f"Content-Length: {2 * SENT}\r\n\r\n"
        )
        writer.write(head.encode())
        writer.write(b"x" * SENT)
        await writer.drain()
        await asyncio.wait_for(got_all.wait(), 20)  # head and 5 MB reached the upstream
        writer.close()  # the client goes away mid-body
        record = await audit.wait_for(path="/upload", timeout=10)
    server.close()
    await server.wait_closed()
    assert record["decision"] == "allow", record
    assert record["reason"] == "allow_rule"
    assert record["rule"] == site
    assert record["end"] == "client_closed"
    assert int(str(record["bytes_up"])) >= SENT
    assert record.get("status") != 400


BIG = 8 * 1024 * 1024
OK_SMALL = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


class Origin:
    """An upstream on a loopback port: `/small` answers at once; `/big` sends the head and
    a first part of an 8 MiB body, `/hold` nothing, `/upload` reads its body; each of the
    last three then waits for `release` (as a slow upstream would)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started: dict[str, asyncio.Event] = {}

    def began(self, path: str) -> asyncio.Event:
        return self.started.setdefault(path, asyncio.Event())

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                path = head.split(b" ", 2)[1].decode()
                if path == "/small":
                    writer.write(OK_SMALL)
                    continue
                if path == "/big":
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % BIG)
                    writer.write(b"x" * (BIG // 2))
                elif path == "/upload":
                    await reader.readexactly(1024)  # a first part of its body
                self.began(path).set()
                await self.release.wait()
                writer.write(b"x" * (BIG // 2) if path == "/big" else OK_SMALL)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def get(site: str, path: str, extra: str = "", method: str = "GET") -> bytes:
    return f"{method} http://{site}{path} HTTP/1.1\r\nHost: {site}\r\n{extra}\r\n".encode()


def reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a client that gives up does."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@pytest.mark.parametrize("kept_alive", [False, True], ids=["first-request", "kept-alive"])
async def test_a_client_reset_inside_a_response_is_the_clients_end(kept_alive: bool) -> None:
    """Issue 32: a client that reset inside a response body was logged `upstream_lost`.
    The relay could not write to the client: `client_closed`. Both drivers: a connection's
    first request (its coroutine) and a kept-alive one on a pooled upstream (the callback
    fast path)."""
    origin = Origin()
    server = await asyncio.start_server(origin.serve, "127.0.0.1", 0)
    port = port_of(server)
    site = f"big.test:{port}"
    audit = MemoryAudit()
    settings = exempt(build_settings({"allow": [site]}, resolve=["big.test=127.0.0.1"]), port)
    try:
        async with EgressProxy(settings, audit=audit) as proxy:
            reader, writer = await asyncio.open_connection(*proxy.addresses[0])
            if kept_alive:
                writer.write(get(site, "/small"))
                status, _, _ = await asyncio.wait_for(read_response(reader), 10)
                assert status == 200
            writer.write(get(site, "/big"))
            await asyncio.wait_for(reader.readexactly(65536), 10)  # the body is flowing
            await asyncio.wait_for(origin.began("/big").wait(), 10)
            reset(writer)
            origin.release.set()  # the rest of the body meets a client that is gone
            record = await audit.wait_for(path="/big", timeout=10)
    finally:
        server.close()
    assert record["decision"] == "allow", record
    assert record["end"] == "client_closed", record  # before: upstream_lost


async def test_requests_in_flight_at_a_stop_end_shutdown() -> None:
    """Issue 32: at SIGTERM only tunnels were recorded `shutdown`; a plain-HTTP request in
    flight was recorded as the failure the close caused: `upstream_error` (awaiting its
    response), `bad_request` (inside its body) or `upstream_lost` (inside its response).
    After the shutdown grace each is the allowed exchange, ended `shutdown`."""
    origin = Origin()
    server = await asyncio.start_server(origin.serve, "127.0.0.1", 0)
    port = port_of(server)
    site = f"slow.test:{port}"
    audit = MemoryAudit()
    settings = exempt(build_settings({"allow": [site]}, resolve=["slow.test=127.0.0.1"]), port)
    writers = []
    try:
        proxy = EgressProxy(settings, audit=audit, limits=Limits(shutdown_grace=0.2))
        await proxy.start()
        try:
            for path, extra, body in (
                ("/hold", "", b""),
                ("/upload", "Content-Length: 4096\r\n", b"u" * 1024),
                ("/big", "", b""),
            ):
                _, writer = await asyncio.open_connection(*proxy.addresses[0])
                writer.write(get(site, path, extra, "POST" if body else "GET"))
                writer.write(body)
                writers.append(writer)
                await asyncio.wait_for(origin.began(path).wait(), 10)
        finally:
            await proxy.stop()
        records = {p: audit.find(path=p) for p in ("/hold", "/upload", "/big")}
    finally:
        for writer in writers:
            writer.close()
        origin.release.set()
        server.close()
    for path, found in records.items():
        assert len(found) == 1, (path, found)
        assert found[0]["decision"] == "allow", found[0]  # before: error, 502 or 400
        assert found[0]["end"] == "shutdown", found[0]
        assert found[0].get("status") is None or path == "/big", found[0]

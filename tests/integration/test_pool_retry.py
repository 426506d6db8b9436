"""A pooled upstream that closed just before it was reused (issue 32, LOW;
docs/proxy.md#upstream-pool).

An origin may close an idle kept-alive connection at any moment; when its FIN crosses the
proxy's reuse of that connection, the request met a closed upstream and got a 502 (9 of 20
GETs in the fault test). A request that may be sent again (RFC 9110 section 9.2.2: an
idempotent method, no body streamed) is sent once more on a fresh connection to the address
already checked, and its one record says `retried: 1`; anything else is still a 502. No root:
the origin listens on a loopback port the guard lets through (`proxykit.exempt`). The origin
here answers one request per connection and closes the connection when the next one comes,
without a byte: every reuse meets the race's outcome, deterministically.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from egress.config import build_settings
from egress.proxy import intake as intake_mod
from egress.proxy.server import EgressProxy

from proxykit import MemoryAudit, exempt, read_response
from servers import port_of


class OneShotOrigin:
    """Answers the first request of each connection (kept alive: no `Connection: close`),
    and closes the connection, unanswered, when a second request arrives on it."""

    def __init__(self) -> None:
        self.connections = 0
        self.unanswered = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await reader.readuntil(b"\r\n\r\n")
            self.unanswered += 1  # the reuse: closed before a byte of its response
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def request(site: str, method: str = "GET", body: bytes | None = None) -> bytes:
    length = f"Content-Length: {len(body)}\r\n" if body is not None else ""
    head = f"{method} http://{site}/r HTTP/1.1\r\nHost: {site}\r\n{length}\r\n"
    return head.encode() + (body or b"")


async def run(
    kept_alive: bool, method: str = "GET", body: bytes | None = None
) -> tuple[list[int], list[dict[str, object]], OneShotOrigin]:
    """20 requests, each after the first on a pooled upstream: on one kept-alive client
    connection (the callback fast path) or a connection each (the coroutine path)."""
    origin = OneShotOrigin()
    server = await asyncio.start_server(origin.serve, "127.0.0.1", 0)
    port = port_of(server)
    site = f"pool.test:{port}"
    audit = MemoryAudit()
    settings = exempt(build_settings({"allow": [site]}, resolve=["pool.test=127.0.0.1"]), port)
    statuses = []
    try:
        async with EgressProxy(settings, audit=audit) as proxy:
            reader, writer = await asyncio.open_connection(*proxy.addresses[0])
            for n in range(20):
                if not kept_alive and n:
                    writer.close()
                    reader, writer = await asyncio.open_connection(*proxy.addresses[0])
                writer.write(request(site, method if n else "GET", body if n else None))
                status, _, _ = await asyncio.wait_for(read_response(reader), 10)
                statuses.append(int(status))
                if status != 200:  # a refusal closes the connection (a body may follow)
                    writer.close()
                    reader, writer = await asyncio.open_connection(*proxy.addresses[0])
                    writer.write(request(site))  # a fresh upstream pools again
                    await asyncio.wait_for(read_response(reader), 10)
            writer.close()
    finally:
        server.close()
    return statuses, audit.find(path="/r"), origin


@pytest.mark.parametrize("kept_alive", [True, False], ids=["fast-path", "coroutine"])
async def test_an_idempotent_request_is_sent_again_on_a_fresh_upstream(
    kept_alive: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    served = []  # the requests the coroutine path served (an observer, not a stand-in)
    real = intake_mod.serve_request

    async def observed(*args: Any) -> bool:
        served.append(1)
        result: bool = await real(*args)
        return result

    monkeypatch.setattr(intake_mod, "serve_request", observed)
    statuses, records, origin = await run(kept_alive)
    # kept alive, each reuse and its retry are the callback fast path's
    assert len(served) == (1 if kept_alive else 20)
    assert statuses == [200] * 20  # before: 200, then 502 for every reuse
    assert origin.unanswered == 19
    assert origin.connections == 20
    assert len(records) == 20  # one record per request, the retry in it
    assert [r.get("retried") for r in records] == [None] + [1] * 19
    assert {r["addr"] for r in records} == {"127.0.0.1"}
    assert all(r["decision"] == "allow" and r["status"] == 200 for r in records)


@pytest.mark.parametrize(
    ("method", "body"),
    [("POST", None), ("PATCH", None), ("PUT", b"hello")],
    ids=["post", "patch", "put-with-a-body"],
)
async def test_a_request_that_may_not_be_sent_twice_is_not(method: str, body: bytes | None) -> None:
    """Not idempotent, or its body was streamed already: a 502, as before, not retried."""
    statuses, records, origin = await run(False, method, body)
    assert statuses[0] == 200
    assert set(statuses[1:]) == {502}
    assert not any(r.get("retried") for r in records)
    assert origin.unanswered >= 19


async def test_a_retry_that_finds_the_origin_gone_is_answered_and_recorded_once() -> None:
    """The fresh connection is refused (the origin stopped listening): the dial's 502,
    in the request's one record, which says it was retried."""
    origin = OneShotOrigin()
    server = await asyncio.start_server(origin.serve, "127.0.0.1", 0)
    port = port_of(server)
    site = f"pool.test:{port}"
    audit = MemoryAudit()
    settings = exempt(build_settings({"allow": [site]}, resolve=["pool.test=127.0.0.1"]), port)
    async with EgressProxy(settings, audit=audit) as proxy:
        reader, writer = await asyncio.open_connection(*proxy.addresses[0])
        writer.write(request(site))
        assert (await asyncio.wait_for(read_response(reader), 10))[0] == 200
        server.close()  # no new connection from here on; the pooled one stays open
        writer.write(request(site))
        assert (await asyncio.wait_for(read_response(reader), 10))[0] == 502
        writer.close()
    records = audit.find(path="/r")
    assert len(records) == 2
    assert records[1]["retried"] == 1
    assert records[1]["decision"] == "error"
    assert records[1]["status"] == 502
    assert origin.unanswered == 1

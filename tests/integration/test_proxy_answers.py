"""Every request gets an answer and a record, and one client cannot hold every connection.

Real proxy, real sockets on loopback; every request here is refused before any dial, so no
origin is needed. Regression tests for the server side of "No state crosses sandboxes":
non-ASCII credentials, the head timeout's record, query strings in `detail`, the per-client
connection cap and reclaiming idle kept-alive connections at the global cap.
"""

from __future__ import annotations

import asyncio
import json
import logging
from ipaddress import ip_network
from pathlib import Path

import pytest

from egress.audit.log import AuditLog
from egress.config import ClientSpec, Settings
from egress.policy.rules import Policy
from egress.proxy.server import EgressProxy, Limits
from egress.proxy.tally import ANSWERED

from proxykit import MemoryAudit, read_response

DENIED = b"GET http://denied.test/ HTTP/1.1\r\nHost: denied.test\r\n\r\n"


async def test_non_ascii_credentials_are_answered_and_recorded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    audit = MemoryAudit()
    spec = ClientSpec("task-1", Policy(allow=["x.test"]), token="s3cret")
    settings = Settings(Policy(), clients=(spec,))
    async with EgressProxy(settings, audit=audit) as proxy:
        reader, writer = await asyncio.open_connection(*proxy.addresses[0])
        writer.write(DENIED)  # a first request keeps the connection alive
        writer.write(
            b"GET http://x.test/ HTTP/1.1\r\nHost: x.test\r\n"
            b"Proxy-Authorization: Basic \xe9\r\n\r\n"
        )
        await writer.drain()
        first, _, _ = await asyncio.wait_for(read_response(reader), 5)
        second, _, body = await asyncio.wait_for(read_response(reader), 5)
        writer.close()
        assert first == 403
        assert second == 407  # obs-text is legal in a field value; the token is not
        assert b"auth_failed" in body
        record = await audit.wait_for(method="GET", host="x.test")
        assert record["status"] == second
        assert record["decision"] in ("block", "error")
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_head_timeout_is_recorded_as_408() -> None:
    audit = MemoryAudit()
    async with EgressProxy(Policy(), audit=audit, limits=Limits(head_timeout=0.2)) as proxy:
        reader, writer = await asyncio.open_connection(*proxy.addresses[0])
        writer.write(b"GET http://x.test/ HTTP/1.1\r\nHost: x")  # never finishes its head
        reply = await asyncio.wait_for(reader.read(-1), 5)
        writer.close()
        assert reply.startswith(b"HTTP/1.1 408 ")
        record = await audit.wait_for(reason="head_timeout")
        assert record["status"] == 408
        assert record["decision"] == "error"
        assert not audit.find(reason="bad_request")


async def test_query_string_in_detail_is_redacted(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    async with AuditLog(str(path)) as log, EgressProxy(Policy(), audit=log) as proxy:
        reader, writer = await asyncio.open_connection(*proxy.addresses[0])
        writer.write(b"GET ftp://u:pw@x.test/?api_key=SECRET HTTP/1.1\r\nHost: x.test\r\n\r\n")
        await writer.drain()
        status, _, _ = await asyncio.wait_for(read_response(reader), 5)
        writer.close()
        assert status == 400
    text = path.read_text()
    assert "SECRET" not in text
    assert "pw@" not in text
    records = [json.loads(line) for line in text.splitlines()]
    refused = [r for r in records if r.get("reason") == "bad_request"]
    assert len(refused) == 1
    assert "?REDACTED" in refused[0]["detail"]


async def _refused_keepalive(
    proxy: EgressProxy, source: str | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, int]:
    local = None if source is None else (source, 0)
    reader, writer = await asyncio.open_connection(*proxy.addresses[0], local_addr=local)
    writer.write(DENIED)
    await writer.drain()
    status, _, _ = await asyncio.wait_for(read_response(reader), 5)
    return reader, writer, status


async def test_per_client_connection_cap() -> None:
    audit = MemoryAudit()
    limits = Limits(max_connections=16, max_client_connections=2)
    async with EgressProxy(Policy(), audit=audit, limits=limits) as proxy:
        held = [await _refused_keepalive(proxy) for _ in range(2)]
        assert [status for _, _, status in held] == [403, 403]
        # the same client (source address) again: its third connection is refused
        _, writer, status = await _refused_keepalive(proxy)
        writer.close()
        assert status == 503
        record = await audit.wait_for(reason="too_many_connections")
        assert "per-client" in str(record["detail"])
        for _, w, _ in held:
            w.close()


async def _refused_at_cap(proxy: EgressProxy, source: str | None = None) -> bytes | None:
    """One connection over the cap: the answer it got, or None for a reset."""
    local = None if source is None else (source, 0)
    try:
        reader, writer = await asyncio.open_connection(*proxy.addresses[0], local_addr=local)
    except ConnectionResetError:
        return None
    try:
        return await asyncio.wait_for(reader.read(-1), 5)
    except ConnectionResetError:
        return None
    finally:
        writer.close()


async def test_a_connection_flood_is_reset_after_its_first_answers_and_all_recorded() -> None:
    """A client at its cap that keeps connecting (issue 19's connection flood): each
    connection is refused at accept; a window's first `ANSWERED` get the 503, the rest only
    a reset (answering them would only feed the flood), and every one of them is in the
    aggregated records' counts (docs/audit-log.md#aggregated-refusals)."""
    audit = MemoryAudit()
    limits = Limits(max_connections=16, max_client_connections=2)
    flood = ANSWERED + 100
    loop = asyncio.get_running_loop()
    async with EgressProxy(Policy(), audit=audit, limits=limits) as proxy:
        held = [await _refused_keepalive(proxy) for _ in range(2)]
        t0 = loop.time()
        got = await asyncio.gather(*(_refused_at_cap(proxy) for _ in range(flood)))
        windows = int(loop.time() - t0) + 1  # refusal windows are one second long
        for _, w, _ in held:
            w.close()
    answered = [g for g in got if g is not None]
    assert all(g.startswith(b"HTTP/1.1 503") for g in answered), answered[:3]
    assert len(answered) >= min(flood, ANSWERED)
    assert len(answered) <= ANSWERED * windows, (len(answered), windows)
    records = audit.find(reason="too_many_connections")
    assert sum(int(str(r.get("count", 1))) for r in records) == flood
    assert len(records) <= 2 * windows
    assert all(r["mode"] == "http" and "per-client" in str(r["detail"]) for r in records)


async def test_one_clients_flood_never_costs_another_client_its_answer() -> None:
    """The reset past a flood's first answers counts per client: while one client (source
    127.0.0.1) floods far past it, another at its cap (127.0.0.2, a sandbox known by that
    source: loopback sources are otherwise one client) still gets its 503 and its own
    record."""
    audit = MemoryAudit()
    limits = Limits(max_connections=16, max_client_connections=2)
    other_sandbox = ClientSpec("other", Policy(), sources=(ip_network("127.0.0.2/32"),))
    settings = Settings(Policy(), clients=(other_sandbox,))
    async with EgressProxy(settings, audit=audit, limits=limits) as proxy:
        held = [await _refused_keepalive(proxy, src) for src in ("127.0.0.1", "127.0.0.2") * 2]
        flood = await asyncio.gather(*(_refused_at_cap(proxy) for _ in range(4 * ANSWERED)))
        assert None in flood  # the flooding client is past its answers
        other = await _refused_at_cap(proxy, "127.0.0.2")
        for _, w, _ in held:
            w.close()
    assert other is not None
    assert other.startswith(b"HTTP/1.1 503")
    records = audit.find(reason="too_many_connections")
    by_source = {str(r["client"]).rsplit(":", 1)[0] for r in records}
    assert by_source == {"127.0.0.1", "127.0.0.2"}


def test_client_cap_default_is_a_quarter() -> None:
    assert Limits().client_cap == 256
    assert Limits(max_connections=3).client_cap == 1
    assert Limits(max_connections=20, max_client_connections=20).client_cap == 20


async def test_idle_keepalive_connections_are_reclaimed_at_the_cap() -> None:
    audit = MemoryAudit()
    limits = Limits(max_connections=2, max_client_connections=10)
    async with EgressProxy(Policy(), audit=audit, limits=limits) as proxy:
        idle = [await _refused_keepalive(proxy) for _ in range(2)]
        # both connections now sit idle after a refusal; a newcomer still gets served
        _, writer, status = await _refused_keepalive(proxy)
        writer.close()
        assert status == 403
        reads = [asyncio.ensure_future(reader.read(-1)) for reader, _, _ in idle]
        done, pending = await asyncio.wait(reads, timeout=5, return_when="FIRST_COMPLETED")
        assert [fut.result() for fut in done] == [b""]  # the longest-idle one was closed
        for fut in pending:
            fut.cancel()
        for _, w, _ in idle:
            w.close()
        assert not audit.find(reason="too_many_connections")


@pytest.mark.parametrize(
    ("head", "method", "host", "port"),
    [
        (b"GET /x HTTP/1.1\r\nHost: a.test:8080\r\n\r\n", "GET", "", 0),
        (b"GET http://a..test:8080/ HTTP/1.1\r\nHost: a..test\r\n\r\n", "GET", "", 0),
        (b"CONNECT bad_host!:443 HTTP/1.1\r\nHost: x\r\n\r\n", "CONNECT", "bad_host!", 443),
        (b"CONNECT bad_host! HTTP/1.1\r\nHost: x\r\n\r\n", "CONNECT", "bad_host!", 0),
    ],
    ids=["origin-form", "bad-host", "connect-bad-host", "connect-no-port"],
)
async def test_a_target_without_destination_names_client_and_listener(
    head: bytes, method: str, host: str, port: int
) -> None:
    """A request refused because its target names no destination (origin-form, a bad
    host) is recorded like a connection record: `listener`, `mode` and `client_id`, and a
    CONNECT's port apart from its host (issue 32: the port stayed inside `host`)."""
    audit = MemoryAudit()
    spec = ClientSpec("task-1", Policy(allow=["a.test"]), token="s3cret")
    settings = Settings(Policy(), clients=(spec,))
    auth = b"Proxy-Authorization: Basic dGFzay0xOnMzY3JldA==\r\n"  # task-1:s3cret
    async with EgressProxy(settings, audit=audit) as proxy:
        reader, writer = await asyncio.open_connection(*proxy.addresses[0])
        writer.write(head.replace(b"\r\n\r\n", b"\r\n" + auth + b"\r\n"))
        await writer.drain()
        status, _, _ = await asyncio.wait_for(read_response(reader), 5)
        writer.close()
        assert status == 400
        record = await audit.wait_for(reason="bad_request")
        listen = proxy.addresses[0]
    assert (record["method"], record["host"], record["port"]) == (method, host, port)
    assert record["listener"] == f"{listen[0]}:{listen[1]}"
    assert record["mode"] == "http"
    assert record["client_id"] == "task-1"

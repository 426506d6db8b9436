"""How an exchange the client abandoned is recorded (docs/audit-log.md#end-values).

An upload to an allowed host whose client closed mid-body, after its head and 5 MB of its
body reached the upstream, was recorded `error`/`bad_request`/400 with no `rule` and no
`bytes_up` (OCSF then said Denied, and `filter --decision allow` hid it). It is the allowed
exchange, ended `client_closed`, with its rule and the bytes sent. No root: the upstream
listens on a loopback port the guard lets through (`proxykit.exempt`).
"""

from __future__ import annotations

import asyncio

from egress.config import build_settings
from egress.proxy.server import EgressProxy

from proxykit import MemoryAudit, exempt
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

"""The proxy never blocks the event loop it shares with the framework (issue 3).

asyncio's debug mode logs every callback or task step that runs longer than
`slow_callback_duration`; a synchronous DNS lookup, file write or netlink call on the loop
would show up here. The workload crosses every path: absolute-form with bodies, CONNECT,
refusals, the audit log, a name resolved through the system resolver (a pin), and shutdown.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from egress import AuditLog, EgressProxy, build_settings

import harness
from proxykit import raw_exchange, read_response
from servers import echo, start_origin, start_tcp

pytestmark = pytest.mark.netns


async def test_no_slow_callbacks_on_the_loop(
    test_host: harness.TestHost, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    origin = await start_origin(test_host, 80)
    echo_srv = await start_tcp(test_host, 7000, echo)
    loop = asyncio.get_running_loop()
    settings = build_settings(
        {"allow": ["up.test", "up.test:7000"], "block": ["evil.test"]},
        resolve=[f"up.test={test_host.addr_ns}", f"evil.test={test_host.addr_ns}"],
    )
    loop.set_debug(True)
    loop.slow_callback_duration = 0.05  # 50 ms: far above any honest step of the proxy
    try:
        with caplog.at_level(logging.WARNING, logger="asyncio"):
            async with (
                AuditLog(str(tmp_path / "a.jsonl")) as audit,
                EgressProxy(settings, audit=audit) as proxy,
            ):
                addr = proxy.addresses[0]
                reader, writer = await asyncio.open_connection(*addr)
                for i in range(50):
                    body = b"x" * (i * 100)
                    writer.write(
                        b"POST http://up.test/p%d HTTP/1.1\r\nContent-Length: %d\r\n\r\n"
                        % (i, len(body))
                        + body
                    )
                    assert (await read_response(reader))[0] == 200
                writer.close()
                for _ in range(20):
                    r, w = await asyncio.open_connection(*addr)
                    w.write(b"CONNECT up.test:7000 HTTP/1.1\r\n\r\nping")
                    await r.readuntil(b"\r\n\r\n")
                    assert await r.readexactly(4) == b"ping"
                    w.close()
                    assert (
                        await raw_exchange(
                            *addr, b"GET http://evil.test/ HTTP/1.1\r\nConnection: close\r\n\r\n"
                        )
                    ).startswith(b"HTTP/1.1 403")
    finally:
        loop.set_debug(False)
        echo_srv.close()
        await origin.close()
    slow = [r.getMessage() for r in caplog.records if "took" in r.getMessage()]
    assert slow == []

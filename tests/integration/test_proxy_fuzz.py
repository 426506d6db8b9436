"""Hostile bytes at the proxy's socket: a 4xx (or a close), an audit line, never a crash or a
hang, and the proxy keeps serving everyone else."""

from __future__ import annotations

import asyncio

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from egress import EgressProxy, Limits, Policy

from proxykit import MemoryAudit, exempt, read_response
from servers import start_origin

TOKENS = [
    b"GET ",
    b"CONNECT ",
    b"POST ",
    b"http://",
    b"https://",
    b"198.18.0.2",
    b"[::1]",
    b":80",
    b":443",
    b"/",
    b" HTTP/1.1",
    b" HTTP/1.0",
    b"\r\n",
    b"\n",
    b"\r",
    b": ",
    b"Host",
    b"Content-Length",
    b"Transfer-Encoding",
    b"chunked",
    b"0",
    b"5",
    b"\x00",
    b"\t",
    b" ",
    b"@",
    b"%",
    b"\xff",
    b"Connection",
    b"close",
    b"\r\n\r\n",
]
HOSTILE = st.lists(st.one_of(st.sampled_from(TOKENS), st.binary(max_size=8)), max_size=40).map(
    b"".join
)


async def exchange(addr: tuple[str, int], data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection(*addr)
    try:
        writer.write(data)
        writer.write_eof()
        async with asyncio.timeout(5):  # the head timeout is 0.5 s: no hang
            return await reader.read(-1)
    finally:
        writer.close()


async def test_hostile_bytes() -> None:
    origin = await start_origin(None, 0)  # on loopback: the guard lets its port through
    audit = MemoryAudit()
    proxy = EgressProxy(
        exempt(Policy(allow=[origin.authority]), origin.port),
        audit=audit,
        limits=Limits(head_timeout=0.5),
    )
    await proxy.start()
    loop = asyncio.get_running_loop()
    addr = proxy.addresses[0]
    bystander_r, bystander_w = await asyncio.open_connection(*addr)
    bystander_w.write(f"GET http://{origin.authority}/first HTTP/1.1\r\n\r\n".encode())
    assert (await read_response(bystander_r))[0] == 200  # now idle on keep-alive

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(HOSTILE)
    def one(data: bytes) -> None:
        reply = asyncio.run_coroutine_threadsafe(exchange(addr, data), loop).result(10)
        status = reply[9:12]
        # what comes back is nothing, or a well-formed HTTP/1.1 response: 2xx only for
        # requests the origin really answered (an allowed absolute-form GET can be valid)
        if reply:
            assert reply.startswith(b"HTTP/1.1 "), reply[:80]
            assert status.isdigit()

    try:
        await asyncio.to_thread(one)
        # the bystander's keep-alive connection is still served
        bystander_w.write(f"GET http://{origin.authority}/alive HTTP/1.1\r\n\r\n".encode())
        status, _, _ = await read_response(bystander_r)
        assert status == 200
        assert all(e["decision"] in ("allow", "block", "error") for e in audit.events)
        assert len(proxy._conns) <= 1
    finally:
        bystander_w.close()
        await proxy.stop()
        await origin.close()

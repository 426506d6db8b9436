"""Names an agent chooses are safe to read (issue 19 item 6, docs/threat-model.md).

Repro: a SOCKS5 CONNECT to a name holding newlines and ANSI sequences forged a whole request
line on `egress serve`'s stderr (no --audit-log), and the same raw name reached
`ExecutionSummary` and `on_decision`. Every human-readable line now escapes control and bidi
characters, and a name that cannot be normalized is kept escaped everywhere.
"""

from __future__ import annotations

import asyncio
import signal
import struct
import sys

from egress import EgressProxy, Policy
from egress.config import ClientSpec

FORGED = "egress: allow CONNECT forged.test:443 allow_rule 200 1.0ms"
NAME = f"x.test\n{FORGED}\n\x1b[2K\x1b[1A\u202eevil"
UNSAFE = ("\n", "\r", "\x1b", "\u202e")


async def socks_connect(
    host: str, port: int, name: str, user: str = "", password: str = ""
) -> bytes:
    """One SOCKS5 CONNECT to `name`; the reply bytes (whatever the proxy said)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        if user:
            writer.write(b"\x05\x01\x02")
            await reader.readexactly(2)
            u, p = user.encode(), password.encode()
            writer.write(bytes((1, len(u))) + u + bytes((len(p),)) + p)
            assert (await reader.readexactly(2))[1] == 0
        else:
            writer.write(b"\x05\x01\x00")
            await reader.readexactly(2)
        raw = name.encode()
        writer.write(b"\x05\x01\x00\x03" + bytes((len(raw),)) + raw + struct.pack("!H", 443))
        return await asyncio.wait_for(reader.read(100), 10)
    finally:
        writer.close()


async def test_a_socks_name_cannot_forge_a_stderr_line() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "egress.cli", "serve", "--listen", "127.0.0.1:0",
        "--socks", "127.0.0.1:0", "--allow", "x.test",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    assert proc.stderr is not None
    try:
        socks = None
        while socks is None:
            line = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode()
            assert line, "serve exited before listening"
            if line.strip().endswith("socks5"):
                socks = line.split()[2].rsplit(":", 1)
        await socks_connect(socks[0], int(socks[1]), NAME)
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 20)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    text = err.decode()
    lines = text.splitlines()
    assert not any(line.startswith(FORGED) for line in lines), text
    assert "\x1b" not in text, text
    assert "\u202e" not in text, text
    request = [line for line in lines if line.startswith("egress: ") and "CONNECT" in line]
    assert len(request) == 1, text  # one record, one line
    assert "\\x0a" in request[0], request
    assert "\\x1b" in request[0], request


async def test_raw_socks_names_never_reach_summaries_or_callbacks() -> None:
    seen: list[dict[str, object]] = []
    proxy = EgressProxy(Policy(allow=["x.test"]), socks=["127.0.0.1:0"], on_decision=seen.append)
    async with proxy:
        proxy.add_client(ClientSpec("sb", Policy(allow=["x.test"]), token="tok"))
        proxy.track_execution("sb")
        await socks_connect(*proxy.socks_addresses[0], NAME, "sb", "tok")
        async with asyncio.timeout(10):
            while not seen:
                await asyncio.sleep(0.01)
        summary = proxy.execution_summary("sb")
    assert summary.total == 1
    hosts = [*summary.by_host, str(seen[0]["host"]), str(seen[0].get("detail", ""))]
    for text in hosts:
        assert not any(c in text for c in UNSAFE), repr(text)
    assert seen[0]["decision"] != "allow"


async def test_a_sandbox_summary_stays_bounded_over_real_sockets() -> None:
    """Item 4 over real SOCKS connections: distinct names beyond the summary's bound are
    folded into `other`, never kept one by one (the 200k-host RSS test is in
    tests/unit/test_summary_bounds.py)."""
    proxy = EgressProxy(Policy(), socks=["127.0.0.1:0"])
    async with proxy:
        proxy.add_client(ClientSpec("sb", Policy(block=["blocked.test"]), token="tok"))
        summary = proxy.track_execution("sb")
        summary.max_hosts = 20
        await socks_connect(*proxy.socks_addresses[0], "blocked.test", "sb", "tok")
        for i in range(100):
            await socks_connect(*proxy.socks_addresses[0], f"h{i}.agent.test", "sb", "tok")
            assert len(summary.by_host) <= 40
        async with asyncio.timeout(10):
            while summary.total < 101:
                await asyncio.sleep(0.01)
        final = proxy.execution_summary("sb", stop=True)
    assert final.total == 101
    assert len(final.by_host) == 20
    assert final.other_hosts == 81
    assert sum(final.other.values()) == 81
    assert "blocked.test" in final.blocked_hosts

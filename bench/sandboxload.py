"""The load side of `bench.scale`: the origin and N sandboxes' clients, in one process.

Run by `bench.scale` as ``taskset -c LOAD python -m bench.sandboxload`` (the load core; the
proxy and its netcut worker are on the other one). It reads one JSON line of setup from
stdin:

    {"origin": {"ns": NS, "address": "198.18.X.2", "port": 8080},
     "sandboxes": [{"ns": NS, "port": 3128, "auth": "Basic ...", "host": "s0.scale.test"}, ...]}

opens the origin's listening socket inside the origin's namespace and one keep-alive client
connection inside each sandbox's namespace (to its proxy listener, 127.0.0.1:PORT there: the
loopback mode), prints ``{"ready": true}``, then answers each command line with one JSON line:

- ``{"phase": "paced", "n": N, "rate": 10, "seconds": S}``: each of the first N sandboxes sends
  `rate` requests a second (a random phase each, so they do not arrive together);
- ``{"phase": "closed", "n": N, "seconds": S}``: each sends its next request as soon as the
  previous answer is in.

Every `CROSS_EVERY`-th request of a sandbox asks for its neighbour's host instead of its own:
isolation holds when every one of those gets 403 and none 200. Latency is from the request's
write to its whole answer, for the sandbox's own host only. The origin answers every request
with 100 bytes (`bench.origin.CountingHTTP`).
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import socket
import sys
import time
from typing import Any, cast

from bench.origin import CountingHTTP
from egress.proxy.netns import call_in_netns_thread

CROSS_EVERY = 10
_LENGTH = re.compile(rb"(?i)\r\ncontent-length:[ \t]*(\d+)")


class Client(asyncio.Protocol):
    """One sandbox's keep-alive connection: one request in flight at a time."""

    def __init__(self, own: bytes, cross: bytes) -> None:
        self.own, self.cross = own, cross
        self.buf = b""
        self.waiter: asyncio.Future[int] | None = None
        self.transport: asyncio.Transport | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buf[: end + 2]
        m = _LENGTH.search(head)
        length = int(m.group(1)) if m else 0
        if len(self.buf) < end + 4 + length:
            return
        self.buf = self.buf[end + 4 + length :]
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(int(head[9:12]))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("closed by the proxy"))

    async def request(self, cross: bool) -> int:
        assert self.transport is not None
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(self.cross if cross else self.own)
        return await self.waiter


class Tally:
    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.own_other: dict[int, int] = {}  # own host, not 200: by status
        self.cross: dict[int, int] = {}
        self.errors = 0
        self.missed = 0  # paced sends skipped because the previous answer was late

    def summary(self, seconds: float) -> dict[str, Any]:
        lat = sorted(self.latencies)
        count = len(lat) + sum(self.own_other.values()) + sum(self.cross.values())

        def q(p: float) -> float | None:
            return round(lat[min(len(lat) - 1, int(p * len(lat)))], 3) if lat else None

        return {
            "requests": count,
            "rps": round(count / seconds, 1),
            "ms_p50": q(0.5),
            "ms_p99": q(0.99),
            "ms_p999": q(0.999),
            "ms_max": round(lat[-1], 3) if lat else None,
            "own_not_200": {str(k): v for k, v in self.own_other.items()},
            "cross_200": self.cross.get(200, 0),
            "cross_403": self.cross.get(403, 0),
            "cross_other": sum(v for k, v in self.cross.items() if k not in (200, 403)),
            "errors": self.errors,
            "missed": self.missed,
        }


async def one(client: Client, k: int, tally: Tally) -> None:
    cross = k % CROSS_EVERY == CROSS_EVERY - 1
    t0 = time.perf_counter()
    try:
        status = await client.request(cross)
    except ConnectionError:
        tally.errors += 1
        return
    ms = (time.perf_counter() - t0) * 1000
    if cross:
        tally.cross[status] = tally.cross.get(status, 0) + 1
    elif status == 200:
        tally.latencies.append(ms)
    else:
        tally.own_other[status] = tally.own_other.get(status, 0) + 1


async def paced(client: Client, rate: float, until: float, tally: Tally) -> None:
    loop = asyncio.get_running_loop()
    period = 1 / rate
    due = loop.time() + random.random() * period
    k = 0
    while not client.closed:
        await asyncio.sleep(max(0.0, due - loop.time()))
        if loop.time() >= until:
            return
        await one(client, k, tally)
        k += 1
        due += period
        while due < loop.time():  # answer later than the next send: that send is missed
            due += period
            tally.missed += 1


async def closed(client: Client, until: float, tally: Tally) -> None:
    loop = asyncio.get_running_loop()
    k = 0
    while not client.closed and loop.time() < until:
        await one(client, k, tally)
        k += 1


def _request(host: str, port: int, auth: str) -> bytes:
    return (
        f"GET http://{host}:{port}/ HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Proxy-Authorization: {auth}\r\nUser-Agent: bench-scale\r\n\r\n"
    ).encode()


async def serve(setup: dict[str, Any]) -> None:
    loop = asyncio.get_running_loop()
    origin = setup["origin"]

    def listening() -> socket.socket:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((origin["address"], origin["port"]))
        s.listen(4096)
        s.setblocking(False)
        return s

    lsock = call_in_netns_thread(origin["ns"], listening)
    server = await loop.create_server(lambda: CountingHTTP(origin["port"]), sock=lsock)
    boxes = setup["sandboxes"]
    clients: list[Client] = []
    for i, box in enumerate(boxes):
        neighbour = boxes[(i + 1) % len(boxes)]["host"] if len(boxes) > 1 else "other.test"

        def dial(port: int = box["port"]) -> socket.socket:
            return socket.create_connection(("127.0.0.1", port), timeout=10)

        sock = call_in_netns_thread(box["ns"], dial)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        own = _request(box["host"], origin["port"], box["auth"])
        cross = _request(neighbour, origin["port"], box["auth"])
        _, proto = await loop.create_connection(lambda o=own, c=cross: Client(o, c), sock=sock)
        clients.append(proto)
    print(json.dumps({"ready": True}), flush=True)
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := await reader.readline():
        cmd = json.loads(line)
        n, seconds = cmd["n"], cmd["seconds"]
        tally = Tally()
        until = loop.time() + seconds
        start = time.perf_counter()
        if cmd["phase"] == "paced":
            await asyncio.gather(*(paced(c, cmd["rate"], until, tally) for c in clients[:n]))
        else:
            await asyncio.gather(*(closed(c, until, tally) for c in clients[:n]))
        result = tally.summary(time.perf_counter() - start)
        result["phase"], result["n"] = cmd["phase"], n
        print(json.dumps(result), flush=True)
    for c in clients:
        if c.transport is not None:
            c.transport.close()
    server.close()


def main() -> None:
    setup = json.loads(sys.stdin.readline())
    try:
        import uvloop

        uvloop.run(serve(setup))
    except ImportError:
        asyncio.run(serve(setup))


if __name__ == "__main__":
    main()

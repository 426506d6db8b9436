"""The kept decision (egress/proxy/core/kept.py) on real sockets: what it may skip, and when not.

A kept-alive request whose connection's last request had the same client, policy, guard and
destination is served from that request's decision (no identification, no judge, no guard
re-check). Each test here first proves the decision is being reused (`Steps.kept_hits`
grows), then changes one thing it depends on - the policy (a client's, a whole reload),
the client table (a sandbox released), the listener's client, the credential, the guard,
the destination - and requires the next request on the same connection to get what a
freshly judged request gets. The upstreams listen on loopback ports the guard lets through
(`proxykit.exempt`): no root needed.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import gc
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest

from egress.config import ClientSpec, build_settings
from egress.policy.rules import Policy
from egress.proxy.server import EgressProxy

from proxykit import MemoryAudit, exempt, read_response
from servers import Origin, start_origin

# the fields that differ between two records of the same request: its timing
TIMING = ("duration_ms",)


@dataclass
class Scene:
    origin: Origin
    other: Origin  # a second origin, on a port the guard lets through too
    proxy: EgressProxy
    audit: MemoryAudit


def allow(origin: Origin, *more: str) -> Policy:
    return Policy(allow=[f"127.0.0.1:{origin.port}", *more])


@pytest.fixture
async def scene() -> AsyncIterator[Scene]:
    origin = await start_origin(None, 0)
    other = await start_origin(None, 0)
    settings = build_settings(
        {"allow": [f"127.0.0.1:{origin.port}", f"www.test:{origin.port}"]},
        resolve=["www.test=127.0.0.1", "evil.test=127.0.0.1"],
    )
    audit = MemoryAudit()
    proxy = EgressProxy(exempt(settings, origin.port, other.port), audit=audit)
    await proxy.start()
    try:
        yield Scene(origin, other, proxy, audit)
    finally:
        await proxy.stop()
        await origin.close()
        await other.close()


def basic(token: str) -> str:
    return "Basic " + base64.b64encode(f"agent:{token}".encode()).decode()


class Connection:
    """One kept-alive client connection to a proxy listener."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def get(self, url: str, token: str | None = None) -> int:
        """One GET on this connection; its status (the connection must stay open)."""
        auth = f"Proxy-Authorization: {basic(token)}\r\n" if token is not None else ""
        self.writer.write(f"GET {url} HTTP/1.1\r\nHost: x\r\n{auth}\r\n".encode())
        async with asyncio.timeout(10):
            status, _, _ = await read_response(self.reader)
        return status


@asynccontextmanager
async def connect(address: tuple[str, int]) -> AsyncIterator[Connection]:
    reader, writer = await asyncio.open_connection(*address)
    try:
        yield Connection(reader, writer)
    finally:
        writer.close()


async def settle(audit: MemoryAudit, n: int) -> list[dict[str, object]]:
    """The first `n` request records, once they are all written."""
    async with asyncio.timeout(5):
        while len(audit.events) < n:
            audit.changed.clear()
            await audit.changed.wait()
    return audit.events[:n]


@asynccontextmanager
async def kept_alive(
    proxy: EgressProxy, url: str, token: str | None = None, address: tuple[str, int] | None = None
) -> AsyncIterator[Connection]:
    """A connection whose requests to `url` are being served from its kept decision: three
    requests (the coroutine path's first, the fast path's judged one, a kept one)."""
    async with connect(address or proxy.addresses[0]) as conn:
        hits = proxy.steps.kept_hits
        assert [await conn.get(url, token) for _ in range(3)] == [200] * 3
        assert proxy.steps.kept_hits == hits + 1, "the third request was not a kept one"
        yield conn


def without(event: dict[str, object], *fields: str) -> dict[str, object]:
    return {k: v for k, v in event.items() if k not in fields}


@pytest.mark.parametrize(
    ("host", "report_only"),
    [("127.0.0.1", False), ("www.test", False), ("127.0.0.1", True)],
    ids=["ip", "name", "report-only"],
)
async def test_a_kept_decision_writes_the_record_a_judged_request_writes(
    scene: Scene, host: str, report_only: bool
) -> None:
    """The records of a request served from the kept decision and of the same request
    judged (by the coroutine path, and by the fast path) are the same but for timing:
    the client, its policy's hash, the rule and reason, report-only's `would` and `detail`,
    the address dialed."""
    proxy = scene.proxy
    if report_only:  # allowed, and the record says the policy would have blocked it
        await proxy.replace_settings(
            exempt(
                build_settings({"allow": []}, report_only=True),
                scene.origin.port,
            )
        )
    url = f"http://{host}:{scene.origin.port}/same?q=1"
    async with kept_alive(proxy, url) as conn:
        assert await conn.get(url) == 200
    assert proxy.steps.kept_hits == 2
    judged, fast, kept, kept_again = await settle(scene.audit, 4)
    assert kept["decision"] == "allow"
    assert kept["host"] == host
    assert ("would" in kept) is report_only
    assert without(kept, *TIMING) == without(judged, *TIMING)
    assert without(kept, *TIMING) == without(fast, *TIMING)
    assert without(kept_again, *TIMING) == without(kept, *TIMING)


async def test_a_client_policy_change_judges_the_next_request_afresh(scene: Scene) -> None:
    """A client's new policy (`set_client_policy`) that still allows the destination: the
    next request's record names the new policy and its rule, not the kept decision's."""
    proxy, origin = scene.proxy, scene.origin
    first = allow(origin)
    proxy.add_client(ClientSpec("a", first, token="tok-a"))
    url = f"http://127.0.0.1:{origin.port}/p"
    async with kept_alive(proxy, url, "tok-a") as conn:
        # the same destination allowed by a rule of its own name: another hash, another rule
        second = Policy(allow=[f"127.0.0.1:{origin.port}", "198.18.0.9"])
        proxy.set_client_policy("a", second)
        hits = proxy.steps.kept_hits
        assert await conn.get(url, "tok-a") == 200
        assert proxy.steps.kept_hits == hits
    events = await settle(scene.audit, 4)
    assert [e["policy"] for e in events] == [first.digest] * 3 + [second.digest]
    assert events[3]["client_id"] == "a"


async def test_a_reload_judges_the_next_request_afresh(scene: Scene) -> None:
    """A reload of the whole configuration (`replace_settings`, as SIGHUP does) whose new
    default policy refuses the destination: the next request is refused."""
    proxy, origin = scene.proxy, scene.origin
    url = f"http://127.0.0.1:{origin.port}/r"
    async with kept_alive(proxy, url) as conn:
        reload = build_settings({"allow": [f"www.test:{origin.port}"]})
        await proxy.replace_settings(exempt(reload, origin.port, scene.other.port))
        # (a reload closes a kept-alive connection whose last destination it refuses)
        if not conn.reader.at_eof():
            with pytest.raises((asyncio.IncompleteReadError, ConnectionError)):
                await conn.get(url)
    events = await settle(scene.audit, 4)
    assert events[3]["end"] == "revoked"
    async with connect(proxy.addresses[0]) as conn:
        assert await conn.get(url) == 403


async def test_a_reload_that_still_allows_it_names_the_new_policy(scene: Scene) -> None:
    """A reload whose new default policy still allows the destination: the connection
    stays open, and its next request is judged by the new policy (its hash, its rule)."""
    proxy, origin = scene.proxy, scene.origin
    url = f"http://127.0.0.1:{origin.port}/r"
    async with kept_alive(proxy, url) as conn:
        reload = build_settings({"allow": [f"127.0.0.1:{origin.port}", "198.18.0.9"]})
        await proxy.replace_settings(exempt(reload, origin.port, scene.other.port))
        assert await conn.get(url) == 200
    events = await settle(scene.audit, 4)
    assert events[3]["policy"] == reload.policy.digest != events[2]["policy"]


async def test_a_released_sandbox_is_not_served_by_its_kept_decision(scene: Scene) -> None:
    """A gateway sandbox's client removed (what `release_execution` does): its token no
    longer identifies anyone, so the next request on its still-open connection is refused
    407, not served and recorded as the released client's."""
    proxy, origin = scene.proxy, scene.origin
    proxy.add_client(ClientSpec("stays", allow(origin), token="tok-stays"))  # (tokens in use)
    proxy.add_client(ClientSpec("gone", allow(origin), token="tok-gone"))
    url = f"http://127.0.0.1:{origin.port}/g"
    async with kept_alive(proxy, url, "tok-gone") as conn:
        proxy.remove_client("gone")
        assert await conn.get(url, "tok-gone") == 407
    events = await settle(scene.audit, 4)
    assert events[3]["reason"] == "auth_failed"


async def test_a_listener_whose_client_is_released_judges_afresh(scene: Scene) -> None:
    """A listener bound to a sandbox's client that lets go of it (a loopback sandbox's
    release on a shared listener: `identity = None`) serves the next request under the
    proxy's default policy, which refuses this destination."""
    proxy, other = scene.proxy, scene.other
    bound = ClientSpec("box", allow(other))
    listener = await proxy.add_listener("127.0.0.1:0", client=bound)
    url = f"http://127.0.0.1:{other.port}/l"
    async with kept_alive(proxy, url, address=(listener.host, listener.port)) as conn:
        listener.identity = None
        assert await conn.get(url) == 403
    events = await settle(scene.audit, 4)
    assert events[3]["client_id"] is None
    assert events[3]["decision"] == "block"


async def test_another_client_on_the_connection_is_identified(scene: Scene) -> None:
    """One connection, two clients' tokens: the request with the second client's token is
    judged by its own policy (which refuses the destination), not by the first's kept
    decision."""
    proxy, origin = scene.proxy, scene.origin
    proxy.add_client(ClientSpec("a", allow(origin), token="tok-a"))
    proxy.add_client(ClientSpec("b", Policy(allow=["198.18.0.9"]), token="tok-b"))
    url = f"http://127.0.0.1:{origin.port}/c"
    async with kept_alive(proxy, url, "tok-a") as conn:
        assert await conn.get(url, "tok-b") == 403
        assert await conn.get(url, "tok-a") == 200
    events = await settle(scene.audit, 5)
    assert [e["client_id"] for e in events] == ["a", "a", "a", "b", "a"]


@pytest.mark.parametrize("change", ["port", "host"])
async def test_another_destination_is_judged(scene: Scene, change: str) -> None:
    """After kept requests to an allowed destination, a request on the same connection to
    another port (or another name of the same address) that the policy does not allow is
    refused."""
    proxy, origin = scene.proxy, scene.origin
    url = f"http://www.test:{origin.port}/d"
    refused = {
        "port": f"http://www.test:{scene.other.port}/d",
        "host": f"http://evil.test:{origin.port}/d",
    }[change]
    async with kept_alive(proxy, url) as conn:
        assert await conn.get(refused) == 403
        assert await conn.get(url) == 200
    events = await settle(scene.audit, 5)
    assert [e["decision"] for e in events] == ["allow"] * 3 + ["block", "allow"]


async def test_a_guard_change_judges_the_next_request_afresh(scene: Scene) -> None:
    """The address guard replaced (the host's addresses re-read, a network reserved): the
    next request is checked by the new guard, which no longer lets loopback through."""
    proxy, origin = scene.proxy, scene.origin
    url = f"http://127.0.0.1:{origin.port}/a"
    async with kept_alive(proxy, url) as conn:
        gate = proxy.steps.gate
        gate.set_guard(dataclasses.replace(gate.guard, exempt=frozenset()))
        assert await conn.get(url) == 403
    events = await settle(scene.audit, 4)
    assert events[3]["decision"] == "block"


async def test_a_closed_connection_lets_go_of_its_kept_policy(scene: Scene) -> None:
    """The kept decision holds its client's policy: when the proxy closes the connection (a
    released sandbox's listener removed), the policy is gone at once, before the loop has
    even reported the connection lost (docs/architecture.md#the-kept-decision)."""
    proxy, other = scene.proxy, scene.other
    policy = allow(other)
    listener = await proxy.add_listener("127.0.0.1:0", client=ClientSpec("box", policy))
    url = f"http://127.0.0.1:{other.port}/gone"
    async with kept_alive(proxy, url, address=(listener.host, listener.port)):
        gone = weakref.ref(policy)
        proxy.remove_listener(listener)  # what a loopback sandbox's release does
        listener.identity = None
        del policy
        gc.collect()
        assert gone() is None, "the closed connection's kept decision held its policy"

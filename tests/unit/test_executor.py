"""The one executor (`drive/executor.py`) and its two drivers, run with no socket.

docs/architecture.md#one-executor: every action is carried out by `Executor.carry_out`, and
the drivers supply only the waiting. These tests run a real `Exchange` and a real gate
against a scripted client side (httpcore's network seam, by hand): bytes handed in turn by
turn, writes kept, so both drivers are shown to wait, resume and end the same way, and an
action no case names to fail loudly in both, never to spin or to pass for an end.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import pytest
from test_exchange import WORLD, intent, make_gate, request_intent

from egress.proxy.core.actions import Done, Relay
from egress.proxy.core.exchange import Exchange
from egress.proxy.drive.callback import Carrier
from egress.proxy.drive.coroutine import drive
from egress.proxy.drive.executor import END, LOOKUP, RELAY, Executor
from egress.proxy.modes.kinds import CONNECT, HTTP
from egress.proxy.net.conn import Conn
from egress.reasons import End

from proxykit import client_hello


@dataclass(frozen=True)
class Unknown:
    """An action no case of the executor names (a new action type a driver never learnt)."""


class ScriptedSide:
    """A connection side with no socket: `script` is what the peer sends, one chunk per wait
    (None: its end); writes are kept."""

    def __init__(self, *script: bytes | None) -> None:
        self.script: deque[bytes | None] = deque(script)
        self.buf = bytearray()
        self.eof = self.lost = self.aborted = self.closed = False
        self.max_buffer = 65536
        self.written: list[bytes] = []
        self.on_wake: Any = None
        self.finished_calls = 0

    def feed(self) -> None:
        chunk = self.script.popleft()
        if chunk is None:
            self.eof = True
        else:
            self.buf += chunk

    async def read_more(self) -> bool:
        if self.eof:
            return False
        self.feed()
        return not self.eof or bool(self.buf)

    def want_more(self) -> None:
        pass

    def write(self, data: bytes) -> bool:
        self.written.append(data)
        return True

    def abort(self) -> None:
        self.aborted = True

    def close(self) -> None:
        self.closed = True

    def finished(self) -> None:  # (a `FastClient`'s: the connection ended without a task)
        self.finished_calls += 1

    def start_relay(self, sink: object, framer: object) -> Relaying:
        self.relaying = Relaying()
        return self.relaying


class Relaying:
    """A relay direction under way (`Side.start_relay`'s future): what waits on its end."""

    def __init__(self) -> None:
        self.callbacks: list[object] = []

    def add_done_callback(self, callback: object) -> None:
        self.callbacks.append(callback)


def make_conn(side: ScriptedSide) -> Conn:
    """The proxy's own connection state (its transitions are what the executor calls) on a
    scripted side, its exchange under way as a driver leaves it."""
    conn = Conn(side, "198.18.0.5:40000", None, None)  # type: ignore[arg-type]
    conn.serving()
    return conn


class Loop:
    def time(self) -> float:
        return 0.0


@dataclass
class Limits:
    max_head: int = 65536


class Resolver:
    def __init__(self, answers: dict[str, tuple[Any, ...]]) -> None:
        self.answers = answers
        self.looked_up: list[str] = []

    def cached(self, host: str) -> tuple[Any, ...] | None:
        return None

    async def resolve(self, host: str) -> tuple[Any, ...]:
        self.looked_up.append(host)
        return self.answers[host]


class Pool:
    def __init__(self, idle: Any = None) -> None:
        self.idle = idle

    def take_idle(self, addrs: tuple[Any, ...], port: int) -> Any:
        idle, self.idle = self.idle, None
        return idle


@dataclass
class Steps:
    """The runtime parts the executor reaches (`runtime.Steps`), with no loop or socket."""

    resolver: Resolver = field(default_factory=lambda: Resolver({"x.test": (WORLD,)}))
    pool: Pool = field(default_factory=Pool)
    metrics: None = None
    loop: Loop = field(default_factory=Loop)
    limits: Limits = field(default_factory=Limits)
    ended: list[Done] = field(default_factory=list)
    linked: int = 0

    def done(self, done: Done) -> None:
        self.ended.append(done)

    def link(self, conn: object, x: Exchange) -> None:
        self.linked += 1

    def addr_text(self, addr: object) -> str:
        return str(addr)


def tunnel_at_reply(steps: Steps, conn: Conn) -> tuple[Exchange, Executor, object]:
    """A CONNECT decided and dialed (the pure events), its `ReplyOk` next."""
    g = make_gate()
    x = Exchange(g, CONNECT)
    x.start(intent(g))
    x.resolved((WORLD,))
    conn.upstream = ScriptedSide()
    reply = x.dialed(WORLD)
    return x, Executor(steps, conn, x), reply  # type: ignore[arg-type]


# --- an action no case names ------------------------------------------------------------------
def test_an_unknown_action_raises_in_the_executor() -> None:
    steps, conn = Steps(), make_conn(ScriptedSide())
    ex = Executor(steps, conn, Exchange(make_gate(), CONNECT))  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match=r"unexpected action Unknown\(\)"):
        ex.carry_out(Unknown())  # type: ignore[arg-type]


async def test_an_unknown_action_raises_in_the_coroutine_driver() -> None:
    """It used to spin: `drive`'s chain had no `else`."""
    steps, conn = Steps(), make_conn(ScriptedSide())
    x = Exchange(make_gate(), CONNECT)
    with pytest.raises(RuntimeError, match="unexpected action"):
        await drive(steps, conn, x, Unknown())  # type: ignore[arg-type]
    assert steps.ended == []


def test_an_unknown_action_raises_in_the_callback_driver(caplog: pytest.LogCaptureFixture) -> None:
    """It used to pass for a `Done`; now it raises, and the driver's one guard logs it and
    closes the connection, with no record written as if it had ended."""
    side = ScriptedSide()
    steps, conn = Steps(), make_conn(side)
    carrier = Carrier(steps, conn, side, lambda *_: None)  # type: ignore[arg-type]
    carrier.ex = Executor(steps, conn, Exchange(make_gate(), CONNECT))  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="unexpected action"):
        carrier._run(Unknown())  # type: ignore[arg-type]
    with caplog.at_level(logging.ERROR, logger="egress"):
        carrier._carry(Unknown)
    assert "unexpected error serving" in caplog.text
    assert side.aborted
    assert side.finished_calls == 1
    assert steps.ended == []


# --- the same exchange through both drivers, with the waits scripted ---------------------------
HELLO_BYTES = client_hello("x.test")


async def test_the_coroutine_driver_waits_for_the_hello() -> None:
    """The ClientHello, sent in two pieces, is read across two waits; then it relays."""
    side = ScriptedSide(HELLO_BYTES[:10], HELLO_BYTES[10:])
    steps, conn = Steps(), make_conn(side)
    x, _, reply = tunnel_at_reply(steps, conn)
    relay = await drive(steps, conn, x, reply)  # type: ignore[arg-type]
    assert relay == Relay(request=False)
    assert side.written == [b"HTTP/1.1 200 Connection established\r\n\r\n"]
    assert side.script == deque()  # both pieces were needed
    assert x.record.sni == "x.test"
    assert side.max_buffer == Limits.max_head
    assert conn.phase == "active"


async def test_the_coroutine_driver_looks_a_name_up_then_takes_an_idle_upstream() -> None:
    side = ScriptedSide()
    upstream = ScriptedSide()
    steps = Steps(pool=Pool((upstream, WORLD)))
    conn = make_conn(side)
    g = make_gate()
    x = Exchange(g, HTTP)
    start = x.start(request_intent(g))
    assert Executor(steps, conn, x).carry_out(start) is LOOKUP  # type: ignore[arg-type]
    x = Exchange(g, HTTP)
    relay = await drive(steps, conn, x, x.start(request_intent(g)))  # type: ignore[arg-type]
    assert relay == Relay(request=True)
    assert steps.resolver.looked_up == ["x.test"]
    assert conn.upstream is upstream
    assert steps.linked == 1
    assert x.record.addr == str(WORLD)


def test_the_callback_driver_waits_for_the_hello_from_wake_ups() -> None:
    """The same hello, from the side's wake-ups: `Wait.HELLO` registers the callback, each
    piece resumes the exchange, the last one takes it to its relay."""
    side = ScriptedSide()
    steps, conn = Steps(), make_conn(side)
    carrier = Carrier(steps, conn, side, lambda *_: None)  # type: ignore[arg-type]
    x, ex, reply = tunnel_at_reply(steps, conn)
    carrier.ex = ex
    carrier._run(reply)  # type: ignore[arg-type]
    assert side.written == [b"HTTP/1.1 200 Connection established\r\n\r\n"]
    assert side.on_wake == carrier._hello_more  # waiting, with no task
    side.buf += HELLO_BYTES[:10]
    side.on_wake()
    assert side.on_wake == carrier._hello_more
    assert conn.relaying is None
    side.buf += HELLO_BYTES[10:]
    side.on_wake()
    assert side.on_wake is None
    assert conn.relaying is x.record  # relaying both ways, ended from the futures' callbacks
    assert len(side.relaying.callbacks) == len(conn.upstream.relaying.callbacks) == 1
    assert x.record.sni == "x.test"


@pytest.mark.parametrize("driver", ["coroutine", "callback"])
def test_a_hello_for_another_name_is_refused_the_same_by_both(driver: str) -> None:
    """A ClientHello naming another host: the SNI refusal, nothing answered after the
    `200`, the tunnel closed, the record written once; both drivers alike."""
    side = ScriptedSide(client_hello("other.test"))
    steps, conn = Steps(), make_conn(side)
    x, ex, reply = tunnel_at_reply(steps, conn)
    if driver == "coroutine":
        assert asyncio.run(drive(steps, conn, x, reply)) is None  # type: ignore[arg-type]
    else:
        carrier = Carrier(steps, conn, side, lambda *_: None)  # type: ignore[arg-type]
        carrier.ex = ex
        carrier._run(reply)  # type: ignore[arg-type]
        assert side.on_wake is not None
        side.feed()
        side.on_wake()
        assert side.finished_calls == 1
    [done] = steps.ended
    assert done.reason == "sni_mismatch"
    assert side.written == [b"HTTP/1.1 200 Connection established\r\n\r\n"]
    assert conn.upstream.closed


def test_a_refusal_before_any_wait_ends_the_exchange_at_once() -> None:
    steps, conn = Steps(), make_conn(ScriptedSide())
    g = make_gate()
    x = Exchange(g, CONNECT)
    ex = Executor(steps, conn, x)  # type: ignore[arg-type]
    step = ex.carry_out(x.start(intent(g, "elsewhere.test:443")))
    assert step is END
    [done] = steps.ended
    assert done.decision == "block"
    assert conn.side.written[0].startswith(b"HTTP/1.1 403")


def test_a_relay_after_a_policy_change_is_judged_again() -> None:
    """A change met while it was dialed (`conn.recheck`): judged again at `Relay`, before
    anything is relayed; still allowed here, so it relays."""
    steps, conn = Steps(), make_conn(ScriptedSide())
    g = make_gate()
    x = Exchange(g, HTTP)
    x.start(request_intent(g))
    x.resolved((WORLD,))
    relay = x.dialed(WORLD)
    conn.recheck = {}
    ex = Executor(steps, conn, x)  # type: ignore[arg-type]
    ex.steps.gate = g  # type: ignore[attr-defined]
    assert ex.carry_out(relay) is RELAY
    assert conn.recheck is None
    assert conn.end != End.REVOKED.value

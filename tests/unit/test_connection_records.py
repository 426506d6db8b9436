"""Records of connections that ended before any exchange (egress/proxy/connection_records.py,
docs/audit-log.md#aggregated-refusals): one per connection, a flood counted into one per
client, listener and reason per second. Loop time is read from a real loop; no sockets."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from egress.proxy.admission import CLIENT_FULL
from egress.proxy.connection_records import ConnectionRecords
from egress.proxy.core.record import AccessRecord
from egress.proxy.net.listener import Listener

Emitted = tuple[AccessRecord, str, str, str | None, str | None, int | None]


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def records(loop: asyncio.AbstractEventLoop) -> tuple[ConnectionRecords, list[Emitted]]:
    emitted: list[Emitted] = []

    def emit(*args: object) -> None:
        emitted.append(args)  # type: ignore[arg-type]

    return ConnectionRecords(loop, emit), emitted


def test_a_flood_at_accept_is_one_record_then_one_with_its_count(
    loop: asyncio.AbstractEventLoop,
) -> None:
    conns, emitted = records(loop)
    listener = Listener("198.18.0.1", 3128)
    answers = [
        conns.at_accept(("198.18.0.9", 40000 + i), listener, "sb", CLIENT_FULL) for i in range(40)
    ]
    assert len(emitted) == 1, "the first refusal of a second is written at once"
    rec, decision, reason, _, detail, status = emitted[0]
    assert (decision, reason, status) == ("error", CLIENT_FULL.reason.value, 503)
    assert (rec.listener, rec.mode, rec.client_id) == ("198.18.0.1:3128", "http", "sb")
    assert answers[0], "the first refusals of a second are answered"
    assert not answers[-1], "past the first few a second, reset, not answered"
    conns.flush(loop.time(), everything=True)
    assert len(emitted) == 2
    last, *_, detail, _ = emitted[1]
    assert last.count == 39
    assert detail is not None
    assert "(39 in one second, this the last)" in detail


def test_two_listeners_are_two_records(loop: asyncio.AbstractEventLoop) -> None:
    conns, emitted = records(loop)
    listeners = [Listener("198.18.0.1", port) for port in (3128, 3129)]  # both alive: by id
    for listener in listeners:
        conns.at_accept(("198.18.0.9", 40000), listener, "sb", CLIENT_FULL)
    assert [e[0].listener for e in emitted] == ["198.18.0.1:3128", "198.18.0.1:3129"]


def test_nothing_is_due_before_its_second_ends(loop: asyncio.AbstractEventLoop) -> None:
    conns, emitted = records(loop)
    listener = Listener("198.18.0.1", 3128)
    for _ in range(3):
        conns.at_accept(("198.18.0.9", 40000), listener, "sb", CLIENT_FULL)
    conns.flush(loop.time(), everything=False)
    assert len(emitted) == 1
    conns.flush(loop.time() + 1.0, everything=False)
    assert len(emitted) == 2
    assert emitted[1][0].count == 2

"""Per-client request slots (egress/proxy/fairshare.py, docs/proxy.md#fair-share)."""

from __future__ import annotations

import asyncio

import pytest

from egress.proxy.fairshare import Turns


async def test_a_client_waits_for_its_own_slot_in_order() -> None:
    turns = Turns(asyncio.get_running_loop(), 2)
    a1, a2 = turns.try_take("a"), turns.try_take("a")
    assert a1 is not None
    assert a2 is not None
    assert turns.try_take("a") is None
    assert turns.try_take("b") is not None  # another client is not held back
    first = asyncio.ensure_future(turns.take("a"))
    second = asyncio.ensure_future(turns.take("a"))
    await asyncio.sleep(0)  # let both queue (not a synchronization on time)
    assert not first.done()
    turns.give_back(a1)
    assert (await first).owner == "a"
    assert not second.done()
    turns.give_back(a1)  # given back twice: counted once
    assert not second.done()
    turns.give_back(a2)
    await second
    assert turns.in_flight("a") == 2


async def test_long_requests_stop_counting_and_a_cancelled_waiter_leaves_no_slot() -> None:
    loop = asyncio.get_running_loop()
    turns = Turns(loop, 1)
    held = turns.try_take("a")
    assert held is not None
    waiter = asyncio.ensure_future(turns.take("a"))
    gone = asyncio.ensure_future(turns.take("a"))
    await asyncio.sleep(0)
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    held.since -= 10 * turns.long  # `held` has become a long request: its slot passes on
    turns.expire(loop.time())
    ticket = await waiter
    turns.give_back(held)  # the long request ends later: nothing left to give back
    assert turns.in_flight("a") == 1
    turns.give_back(ticket)
    assert turns.in_flight("a") == 0


async def test_no_cap() -> None:
    turns = Turns(asyncio.get_running_loop(), None)
    assert all(turns.try_take("a") is not None for _ in range(100))


async def test_a_given_back_ticket_is_let_go_at_once() -> None:
    """Given-back tickets leave the client's queue when they are given back, not at the
    sweeper's next tick: at 4,000 requests a second a second's worth of dead tickets
    outlived the collector's young generation (docs/proxy.md#garbage-collection)."""
    turns = Turns(asyncio.get_running_loop(), 8)
    for _ in range(1000):
        ticket = turns.try_take("a")
        assert ticket is not None
        turns.give_back(ticket)
    assert turns.held("a") == 0
    first, second = turns.try_take("a"), turns.try_take("a")
    assert first is not None
    assert second is not None
    turns.give_back(second)  # ends before the older one: kept behind it until it ends
    assert turns.held("a") == 2
    turns.give_back(first)
    assert turns.held("a") == 0
    assert turns.in_flight("a") == 0


class Presence:
    """Whether another client is present (the proxy asks `Slots.others_present`)."""

    def __init__(self) -> None:
        self.others = False

    def __call__(self, owner: object, now: float) -> bool:
        return self.others


async def test_a_lone_client_is_not_capped() -> None:
    """Issue 24: a client alone has nobody to be fair to (the cap halved its throughput)."""
    presence = Presence()
    turns = Turns(asyncio.get_running_loop(), 2, presence)
    tickets = [turns.try_take("a") for _ in range(5)]
    assert all(t is not None for t in tickets)
    assert turns.in_flight("a") == 5


async def test_a_newcomer_goes_ahead_of_a_client_over_its_share() -> None:
    """A client over its share when another comes takes no new slot until it is back under
    the cap (an ended request's slot is let go, not passed on), while the newcomer's
    requests take slots of their own at once."""
    presence = Presence()
    turns = Turns(asyncio.get_running_loop(), 2, presence)
    hog = [turns.try_take("hog") for _ in range(4)]
    presence.others = True
    assert turns.try_take("victim") is not None  # at once, the hog's 4 in flight or not
    queued = asyncio.ensure_future(turns.take("hog"))
    await asyncio.sleep(0)  # let it queue (not a synchronization on time)
    assert turns.try_take("victim") is not None  # ahead of the hog's queued request
    for t in hog[:2]:
        assert t is not None
        turns.give_back(t)  # let go, not passed on: the hog is at its share, not under
    assert turns.in_flight("hog") == 2
    await asyncio.sleep(0)
    assert not queued.done()
    assert hog[2] is not None
    turns.give_back(hog[2])
    ticket = await queued  # the hog back under its share: its queue moves again
    assert turns.in_flight("hog") == 2
    assert ticket.owner == "hog"


async def test_when_the_others_leave_every_waiting_request_goes() -> None:
    presence = Presence()
    presence.others = True
    turns = Turns(asyncio.get_running_loop(), 1, presence)
    first = turns.try_take("a")
    assert first is not None
    waiting = [asyncio.ensure_future(turns.take("a")) for _ in range(3)]
    await asyncio.sleep(0)
    presence.others = False
    turns.give_back(first)
    await asyncio.gather(*waiting)
    assert turns.in_flight("a") == 3
    assert turns.waiting("a") == 0

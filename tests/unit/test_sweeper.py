"""`Sweeper` (egress/proxy/sweeper.py): how often it wakes, from the limits it enforces
(docs/proxy.md#limits): a quarter of the shortest deadline, between 0.05 and 1 s."""

from __future__ import annotations

import pytest

from egress import EgressProxy, Limits, Policy


@pytest.mark.parametrize(
    ("limits", "tick"),
    [
        (Limits(), 1.0),
        (Limits(head_timeout=2.0), 0.5),
        (Limits(connect_timeout=1.0), 0.25),
        (Limits(head_timeout=0.1), 0.05),
    ],
    ids=["defaults-at-most-1s", "head-timeout", "connect-timeout", "at-least-50ms"],
)
async def test_the_tick_follows_the_shortest_deadline(limits: Limits, tick: float) -> None:
    async with EgressProxy(Policy(), limits=limits) as proxy:
        assert proxy.sweeper is not None
        assert proxy.sweeper.tick() == tick
        assert proxy.sweeper.task is not None
        assert not proxy.sweeper.task.done()
    assert proxy.sweeper.task.done(), "stop ends the sweeper"

"""The privilege rail's shared /proc walk (netcut/safety.py): concurrent cuts share one walk,
but a caller never gets a walk that began before it asked (it would miss a process that
entered the namespace meanwhile)."""

from __future__ import annotations

import os
import threading

import pytest

from netcut import safety


def test_a_walk_begun_before_the_ask_is_not_the_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    first_running, release_first = threading.Event(), threading.Event()
    walks: list[int] = []

    def walk() -> dict[str, list[str]]:
        walks.append(len(walks) + 1)
        number = walks[-1]
        if number == 1:
            first_running.set()
            assert release_first.wait(30)
        return {f"net:[{number}]": [str(number)]}

    monkeypatch.setattr(safety, "_walk", walk)
    shared = safety._SharedWalk()
    answers: dict[str, dict[str, list[str]]] = {}
    a = threading.Thread(target=lambda: answers.update(a=shared.members()))
    a.start()
    assert first_running.wait(30)
    # B asks while walk 1 runs: whether it waits for it or comes after it, its answer must
    # be a walk that began after it asked.
    b = threading.Thread(target=lambda: answers.update(b=shared.members()))
    b.start()
    release_first.set()
    a.join(30)
    b.join(30)
    assert answers["a"] == {"net:[1]": ["1"]}
    assert answers["b"] == {"net:[2]": ["2"]}
    assert walks == [1, 2]


def test_a_failed_walk_is_not_an_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def walk() -> dict[str, list[str]]:
        calls.append(1)
        if len(calls) == 1:
            raise OSError("proc went away")
        return {}

    monkeypatch.setattr(safety, "_walk", walk)
    shared = safety._SharedWalk()
    with pytest.raises(OSError, match="proc went away"):
        shared.members()
    assert shared.members() == {}
    assert len(calls) == 2


def test_the_walk_finds_this_process() -> None:
    own = safety.identity_of("/proc/self/ns/net")
    assert own is not None
    assert str(os.getpid()) in safety._walk()[f"net:[{own[1]}]"]
    if os.geteuid() == 0:  # root reads every ns/net link; this process holds the caps
        assert any(f"pid {os.getpid()} " in p for p in safety.privileged_processes(own))


def test_a_walk_begun_after_the_ticket_is_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cut that waited for a worker takes the walk another cut began meanwhile; one whose
    ticket is newer than every walk walks again."""
    walks: list[int] = []

    def walk() -> dict[str, list[str]]:
        walks.append(len(walks) + 1)
        return {f"net:[{walks[-1]}]": []}

    monkeypatch.setattr(safety, "_walk", walk)
    shared = safety._SharedWalk()
    waiting = shared.ticket()  # asked, then waited for a worker
    assert shared.members() == {"net:[1]": []}  # another cut's walk, begun after that ticket
    assert shared.members(waiting) == {"net:[1]": []}
    assert walks == [1]
    late = shared.ticket()  # asked after walk 1 began
    assert shared.members(late) == {"net:[2]": []}
    assert walks == [1, 2]


def test_an_async_cut_is_asked_when_called_not_when_a_thread_is_free() -> None:
    """The async API takes the cut's ticket on the caller's loop when the coroutine is called
    (netcut/api.py): a walk begun after that, even before the executor's thread runs the
    cut, serves it; and the thread forgets the ticket afterwards (a later plain call asks
    anew)."""
    import asyncio

    from netcut import api

    seen: dict[str, int] = {}

    def in_thread() -> int:
        return api._walk_ticket()

    async def main() -> None:
        asked = safety.walk_ticket()
        pending = api._cut_in_thread(in_thread)
        safety._walks.members()  # a walk begins between the ask and the thread running
        seen["asked"], seen["in_thread"] = asked, await pending
        seen["after"] = await asyncio.to_thread(api._walk_ticket)

    asyncio.run(main())
    assert seen["in_thread"] == seen["asked"]
    assert seen["after"] == seen["asked"] + 1  # a new ask sees the walk begun meanwhile

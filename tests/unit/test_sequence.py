"""The legal sequence of an exchange as data (egress/proxy/core/sequence.py): the table
itself, without an `Exchange` (tests/unit/test_exchange.py drives the machine)."""

from __future__ import annotations

from egress.proxy.core.sequence import IDEMPOTENT, TRANSITIONS, State


def _moves() -> dict[State, set[State]]:
    reach: dict[State, set[State]] = {s: set() for s in State}
    for moves in TRANSITIONS.values():
        for start, ends in moves.items():
            reach[start] |= ends
    return reach


def _reachable(start: State, moves: dict[State, set[State]]) -> set[State]:
    seen, todo = {start}, [start]
    while todo:
        for nxt in moves[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def test_every_state_can_end_and_every_state_can_be_reached() -> None:
    """No exchange can be stranded, no state is dead table: each is reachable from IDLE
    and leads to DONE; a refusal ends any state but DONE."""
    moves = _moves()
    assert _reachable(State.IDLE, moves) == set(State)
    for state in State:
        assert State.DONE in _reachable(state, moves), state
        if state is not State.DONE:
            assert TRANSITIONS["refuse"][state] == frozenset({State.DONE})


def test_done_is_final() -> None:
    """No event is legal after DONE: a late event is a driver's bug (SequenceError)."""
    assert not _moves()[State.DONE]
    assert all(State.DONE not in moves for moves in TRANSITIONS.values())


def test_a_request_is_sent_before_it_is_answered_and_only_then_retried() -> None:
    assert TRANSITIONS["sent"] == {State.SENDING: frozenset({State.AWAITING})}
    assert set(TRANSITIONS["response"]) == {State.AWAITING}
    assert TRANSITIONS["retry"] == {State.AWAITING: frozenset({State.SENDING})}


def test_only_idempotent_methods_are_retried() -> None:
    """RFC 9110 section 9.2.2: POST and PATCH are never sent twice."""
    assert {"GET", "HEAD", "PUT", "DELETE"} <= IDEMPOTENT
    assert not {"POST", "PATCH", "CONNECT"} & IDEMPOTENT

"""`ConnectionRecords`: the records of connections that ended before any exchange.

Shell (it reads the loop's clock). A connection refused at accept or before its first
request was understood, or closed by the proxy before any exchange (a head, handshake or
identify timeout, an eviction), gets one record naming its listener, the listener's mode
and its client when known, so nothing a sandbox does goes unrecorded
(docs/audit-log.md). A flood of them is bounded: past the first of a second, the refusals
of one client, listener and reason are counted into one record with a `count` (`tally.py`,
docs/audit-log.md#aggregated-refusals), and a record is built only if it is written. A part
of `Steps` (`runtime.py`), handed its `emit`, the one place a record leaves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ..policy.target import join_host_port
from ..reasons import End, Reason
from .admission import Owner
from .core.clients import admission_source
from .core.gate import Verdict
from .core.record import AccessRecord, perf_counter_ns
from .core.responses import refusal_for
from .net.conn import Conn
from .net.listener import Listener, peer_text
from .tally import Tally, answer_in_full

# how a connection the proxy closed before any exchange is recorded (docs/audit-log.md)
_CLOSED: dict[str, tuple[Reason, str]] = {
    End.HEAD_TIMEOUT.value: (
        Reason.HEAD_TIMEOUT,
        "closed: nothing received within the head timeout",
    ),
    End.HELLO_TIMEOUT.value: (
        Reason.HEAD_TIMEOUT,
        "closed: handshake not completed within the head timeout",
    ),
    End.IDENTIFY_TIMEOUT.value: (
        Reason.IDENTIFY_TIMEOUT,
        "closed: no request named its client within identify_timeout",
    ),
    End.EVICTED.value: (
        Reason.EVICTED,
        "closed unidentified: its source's budget of unidentified connections was full",
    ),
}
# a connection record as the tally keeps it, built only if it is written (a flood's
# refusals are mostly only counted): (client, t0, listener, mode, end, owner, reason,
# detail, status)
_Pending = tuple[str, int, str, str, str | None, Owner | None, str, str, int | None]
# `Steps.emit`: (record, decision, reason, rule, detail, status)
Emit = Callable[[AccessRecord, str, str, str | None, str | None, int | None], None]


class ConnectionRecords:
    """One record per connection that ended before any exchange, floods tallied."""

    __slots__ = ("emit", "loop", "tally")

    def __init__(self, loop: asyncio.AbstractEventLoop, emit: Emit) -> None:
        self.loop = loop
        self.emit = emit
        self.tally: Tally[_Pending] = Tally()

    def refused(self, conn: Conn, refusal: Verdict, status: int | None) -> None:
        """A connection refused before any request was understood (already answered)."""
        self._record(conn, refusal.reason.value, refusal.detail, status)

    def closed(self, conn: Conn) -> None:
        """A connection the proxy closed before any exchange (timeouts, eviction), if it
        was one: one record."""
        if conn.served or conn.end is None:
            return
        found = _CLOSED.get(conn.end)
        if found is not None:
            reason, detail = found
            self._record(conn, reason.value, detail, None, end=conn.end)

    def at_accept(self, peer: object, listener: Listener, owner: Owner, refusal: Verdict) -> bool:
        """A connection refused at accept, before a `Conn` exists: recorded (counted), and
        whether to answer it in full (`tally.answer_in_full`) or just reset it."""
        key = (id(listener), owner, refusal.reason.value)
        full = answer_in_full(self.tally.seen(key, self.loop.time()))
        status = refusal_for(refusal.reason, refusal.status).status
        pending: _Pending = (
            peer_text(peer),
            perf_counter_ns(),
            *_where(listener),
            None,
            owner,
            refusal.reason.value,
            refusal.detail,
            status,
        )
        self._count(key, pending)
        return full

    def _record(
        self, conn: Conn, reason: str, detail: str, status: int | None, end: str | None = None
    ) -> None:
        owner = conn.owner
        who = owner if owner is not None else source_owner(conn)
        key = (id(conn.listener), who, reason)
        pending: _Pending = (
            conn.client,
            perf_counter_ns(),
            *_where(conn.listener),
            end,
            owner,
            reason,
            detail,
            status,
        )
        self._count(key, pending)

    def _count(self, key: object, pending: _Pending) -> None:
        """Into the tally; write what it says is due (`tally.py`)."""
        for written, count in self.tally.add(key, pending, self.loop.time()):
            self._write(written, count)

    def _write(self, pending: _Pending, count: int) -> None:
        client, t0, listener, mode, end, owner, reason, detail, status = pending
        rec = AccessRecord.for_connection(client, t0, listener, mode, end, owner)
        if count > 1:
            rec.tallied(count)
            detail = f"{detail} ({count} in one second, this the last)"
        self.emit(rec, "error", reason, None, detail, status)

    def flush(self, now: float, *, everything: bool) -> None:
        """Write the counted records whose second has ended (all of them: `everything`)."""
        for pending, count in self.tally.due(now, everything=everything):
            self._write(pending, count)


def source_owner(conn: Conn) -> Owner:
    """The default client's key for `conn`: its source address (every loopback source of a
    namespace one, `core.clients.admission_source`)."""
    peer = conn.peer
    source = str(peer[0] if isinstance(peer, tuple) and peer else conn.client)
    return ("source", admission_source(source, conn.listener.netns))


def _where(listener: Listener) -> tuple[str, str]:
    """A connection record's `listener` (HOST:PORT) and `mode`."""
    mode = "forward" if listener.forward_to is not None else listener.kind
    return join_host_port(listener.host, listener.port), mode


__all__ = ["ConnectionRecords", "Emit", "source_owner"]

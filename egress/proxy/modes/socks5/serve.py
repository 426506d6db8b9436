"""A SOCKS5 connection: the handshake (`front.Handshake`, pure), then the CONNECT exchange.

Strategy: the client's bytes go through the pure handshake (greeting, RFC 1929 credentials,
the CONNECT request; the connection is in phase `hello`, so the sweeper closes a client that
stalls there after `head_timeout`), which identifies the client by its listener or its token
(the gate's `identify`, the password as a Basic credential's) and ends as an `Intent`; then
authorize, resolve, guard, dial, SNI-check and relay exactly as for an HTTP CONNECT (the
driver, `drive.tunnel.relay_tunnel`), answering refusals with an RFC 1928 reply code instead of an
HTTP status. Records are CONNECT records with `mode: "socks5"` (docs/audit-log.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...core.exchange import Exchange
from ...core.intent import Intent
from ...core.record import perf_counter_ns
from ...drive.coroutine import drive
from ...drive.tunnel import relay_tunnel
from .front import SOCKS5, Handshake

if TYPE_CHECKING:
    from ...net.conn import Conn
    from ...runtime import Steps


async def serve_socks(steps: Steps, conn: Conn) -> None:
    """Serve one SOCKS5 client connection to its end (the caller closes the sockets)."""
    t0 = perf_counter_ns()
    conn.handshake_begins(steps.loop.time())
    intent = await _handshake(steps, conn, t0)
    if intent is None:
        return
    x = Exchange(steps.gate, SOCKS5)
    if await drive(steps, conn, x, x.start(intent)) is not None:
        await relay_tunnel(steps, conn, x)


async def _handshake(steps: Steps, conn: Conn, t0: int) -> Intent | None:
    """Feed the client's bytes to the handshake until it is over: its `Intent` (None: the
    client went away first)."""
    side = conn.side
    bound = conn.listener.identity
    handshake = Handshake(
        steps.gate, conn.client, conn.peer, bound, t0, cap=lambda found: steps.cap(conn, found)
    )
    audit = steps.audit
    while True:
        used, answer = handshake.receive(side.buf, audit_ok=audit is None or audit.accepting)
        if used:
            side.consume(used)
        if answer:
            side.write(answer)
        intent = handshake.intent
        if intent is not None:
            if handshake.requested:
                conn.serving()
            else:
                conn.accounted()
            return intent
        if not await side.read_more():
            return None

"""A forwarder listener's connection: relayed to its framework route.

Shell. The exchange is carried out on the coroutine (`drive.tunnel.carry_on`) like a
tunnel's, and gets how the relay ended (`reasons.End`) for its one record. Whatever stops
it (the audit log, DNS, the dial) closes it unanswered (`kinds.FORWARDER`): there is no
protocol to answer in. Its records have no `mode` (docs/audit-log.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.exchange import Exchange
from ..core.intent import Intent
from ..core.record import perf_counter_ns
from ..drive.tunnel import carry_on
from .kinds import FORWARDER

if TYPE_CHECKING:
    from ..net.conn import Conn
    from ..runtime import Steps


async def serve_forwarder(steps: Steps, conn: Conn, forward_to: tuple[str, int]) -> None:
    """A forwarder connection: relay it to the listener's framework route. No `policy`
    hash in its records: the route decides, not a policy the log ever recorded
    (docs/audit-log.md#request-records)."""
    host, port = forward_to
    conn.serving()
    audit = steps.audit
    intent = Intent(
        conn.client,
        "FORWARD",
        "tcp",
        host,
        port,
        perf_counter_ns(),
        None,
        conn.listener.identity,
        audit_ok=audit is None or audit.accepting,
    )
    x = Exchange(steps.gate, FORWARDER)
    await carry_on(steps, conn, x, x.start(intent))


__all__ = ["serve_forwarder"]

"""The CONNECT front-end: a request head into an `Intent` and the exchange that carries it.

Shell. `connect_exchange` turns the request head into an `Intent` (the gate's target and
identity) and starts the exchange; both drivers begin a tunnel there. On the coroutine,
`serve_tunnel` lets the async driver carry it out (`drive.coroutine.drive`: decide, resolve,
dial, `200`, the SNI check) and relay it (`drive.tunnel`); the callback driver
(`drive.callback.Carrier`) carries out the same exchange from callbacks
(docs/architecture.md#the-callback-driver). Its answers are `kinds.CONNECT`'s: an HTTP
status before its `200`; after it, a tunnel refused by the SNI check is closed, nothing more
said (docs/proxy.md#tls-sni-check).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..codec import http1 as wire
from ..core.actions import Action
from ..core.exchange import Exchange
from ..core.gate import Verdict
from ..core.intent import Intent
from ..core.record import perf_counter_ns
from ..drive.tunnel import carry_on
from .kinds import CONNECT

if TYPE_CHECKING:
    from ..net.conn import Conn
    from ..runtime import Steps


def connect_exchange(steps: Steps, conn: Conn, head: wire.RequestHead) -> tuple[Exchange, Action]:
    """A CONNECT's exchange and its first action: target, identity, its client's cap, the
    verdict on the name (both drivers start a tunnel here)."""
    t0 = perf_counter_ns()
    gate = steps.gate
    target = gate.connect_target(head.target)
    identity = gate.identify(conn.listener.identity, conn.peer, head)
    cap = listener = None
    host, port = head.target, 0
    if not isinstance(target, Verdict):
        cap = steps.cap(conn, identity)
    else:  # no destination: the target as written, the listener named (docs/audit-log.md)
        host, port = written_authority(head.target)
        listener = conn.listener.named
    audit = steps.audit
    intent = Intent(
        conn.client,
        "CONNECT",
        "https",
        host,
        port,
        t0,
        target,
        identity,
        cap,
        audit_ok=audit is None or audit.accepting,
        listener=listener,
    )
    x = Exchange(gate, CONNECT)
    return x, x.start(intent)


def written_authority(text: str) -> tuple[str, int]:
    """A CONNECT target that did not parse, as its record shows it: `host:port` split when
    it ends in a port number (`bad_host!:443` -> `bad_host!`, 443; `[::1]:x` stays whole),
    else the text whole with port 0."""
    host, sep, port = text.rpartition(":")
    if not (sep and host and port.isdigit() and len(port) <= 5 and int(port) <= 65535):
        return text, 0
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


async def serve_tunnel(steps: Steps, conn: Conn, head: wire.RequestHead) -> None:
    """One CONNECT: target, identity, then the exchange (verdict, dial, `200`, SNI, relay)."""
    x, action = connect_exchange(steps, conn, head)
    await carry_on(steps, conn, x, action)


__all__ = ["connect_exchange", "serve_tunnel"]

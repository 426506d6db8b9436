"""A SOCKS5 connection: handshake by `socks5` (pure), then the CONNECT steps (tunnel.py).

Strategy: read the greeting, the RFC 1929 credentials and the CONNECT request with the pure
parsers (the connection is in phase `hello`, so the sweeper closes a client that stalls there
after `head_timeout`); identify the client by its listener or its token (the gate's
`identify`, the password as a Basic credential's); then authorize, resolve, guard, dial,
SNI-check and relay exactly as for an HTTP CONNECT (`Steps`, `tunnel.relay_tunnel`),
answering refusals with an RFC 1928 reply code instead of an HTTP status. Records are CONNECT
records with `mode: "socks5"` (docs/audit-log.md).
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING

from ....errors import TargetError
from ....policy.target import Target, make_target
from ....printable import printable
from ....reasons import Reason, reason_of
from ...codec import socks5
from ...core.clients import Identity
from ...core.exchange import Exchange
from ...core.gate import Refuse, refuse_request
from ...core.intent import Intent
from ...core.record import perf_counter_ns
from ...driver import drive
from ...net.conn import read_message
from ...tunnel import relay_tunnel
from .front import SOCKS5

if TYPE_CHECKING:
    from ...net.conn import Conn
    from ...runtime import Steps


async def serve_socks(steps: Steps, conn: Conn) -> None:
    """Serve one SOCKS5 client connection to its end (the caller closes the sockets)."""
    t0 = perf_counter_ns()
    conn.phase, conn.phase_since = "hello", steps.loop.time()
    intent = await _intent(steps, conn, t0)
    if intent is None:
        return
    x = Exchange(steps.gate, SOCKS5)
    if await drive(steps, conn, x, x.start(intent)) is not None:
        await relay_tunnel(steps, conn, x)


async def _intent(steps: Steps, conn: Conn, t0: int) -> Intent | None:
    """The handshake as an `Intent` (None: the client went away first); a malformed or
    unsupported message is a refusal with the codec's reason (and reply, when a request
    can be answered)."""
    identity: Identity | None = None
    try:
        found = await _authenticate(steps, conn, t0)
        if found is None or isinstance(found, Intent):
            return found
        identity = found
        return await _request(steps, conn, t0, identity)
    except socks5.SocksError as exc:
        conn.served = True
        refusal = Refuse(reason_of(exc.reason), str(exc))
        return Intent(
            conn.client,
            "CONNECT",
            "https",
            "",
            0,
            t0,
            refusal,
            identity,
            answerable=exc.reply is not None,
        )


async def _authenticate(steps: Steps, conn: Conn, t0: int) -> Identity | Intent | None:
    """Method selection and RFC 1929 credentials: the identity, or a refused intent."""
    side = conn.side
    greeting = await read_message(side, socks5.parse_greeting)
    if greeting is None:
        return None
    bound = conn.listener.identity
    require = steps.gate.clients.require_auth and bound is None
    method = socks5.choose_method(greeting, require)
    side.write(socks5.method_reply(method))
    if method == socks5.METHOD_UNACCEPTABLE:
        conn.served = True
        refusal = Refuse(
            Reason.AUTH_REQUIRED,
            "SOCKS5 client offered no acceptable "
            "authentication method (username/password required)",
        )
        return Intent(conn.client, "CONNECT", "https", "", 0, t0, None, refusal, answerable=False)
    authorization = None
    if method == socks5.METHOD_USERPASS:
        creds = await read_message(side, socks5.parse_credentials)
        if creds is None:
            return None
        pair = f"{creds.username}:{creds.password}".encode()
        authorization = "Basic " + base64.b64encode(pair).decode("ascii")
    found = steps.gate.identify_credential(bound, conn.peer, authorization)
    cap = steps.cap(conn, found)
    if method == socks5.METHOD_USERPASS:
        side.write(socks5.auth_reply(isinstance(found, Identity) and cap is None))
    if isinstance(found, Refuse) or cap is not None:
        conn.served = True
        return Intent(
            conn.client, "CONNECT", "https", "", 0, t0, None, found, cap, answerable=False
        )
    return found


async def _request(steps: Steps, conn: Conn, t0: int, identity: Identity) -> Intent | None:
    """The CONNECT request: its target (the gate's own parse of a name the agent chose)."""
    request = await read_message(conn.side, socks5.parse_request)
    if request is None:
        return None
    conn.phase, conn.served = "active", True
    # a name the agent chose: escaped until normalized, so a raw newline or ANSI escape
    # never reaches stderr, a summary or on_decision (docs/threat-model.md)
    host = printable(request.host)
    target: Target | Refuse
    try:
        target = make_target("https", request.host, request.port)
    except TargetError as exc:
        target = refuse_request(printable(str(exc)))
    audit = steps.audit
    return Intent(
        conn.client,
        "CONNECT",
        "https",
        host,
        request.port,
        t0,
        target,
        identity,
        audit_ok=audit is None or audit.accepting,
    )

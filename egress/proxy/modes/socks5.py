"""A SOCKS5 connection: its handshake (sans I/O) into an `Intent`, then the CONNECT exchange.

Strategy: the client's bytes go through `Handshake`, the greeting, the RFC 1929 credentials
and the CONNECT request as a sans-I/O state machine (bytes in, bytes to answer out, then the
`Intent`), so every stage of it is tested without a socket; `serve_socks` only moves its
bytes (the connection is in phase `hello`, so the sweeper closes a client that stalls there
after `head_timeout`). It identifies the client by its listener or its token (the gate's
`identify`, the password as a Basic credential's); then authorize, resolve, guard, dial,
SNI-check and relay exactly as for an HTTP CONNECT (the driver, `drive.tunnel.relay_tunnel`),
answering refusals with an RFC 1928 reply code instead of an HTTP status: the table is
`kinds.SOCKS5_ANSWERS`, which names every reason (a test proves it), so no refusal quietly
becomes a "general failure". Records are CONNECT records with `mode: socks5` and
`socks_reply` (docs/proxy.md#transparent-mode-and-socks5).
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from ...errors import TargetError
from ...policy.target import Target, make_target
from ...printable import printable
from ...reasons import Reason, reason_of
from ..codec import socks5 as codec
from ..core.clients import Identity
from ..core.exchange import Exchange
from ..core.gate import Gate, Verdict, refuse_request
from ..core.intent import Intent
from ..core.record import perf_counter_ns
from ..drive.coroutine import drive
from ..drive.tunnel import relay_tunnel
from .kinds import SOCKS5

if TYPE_CHECKING:
    from ..net.conn import Conn
    from ..runtime import Steps


NO_METHOD: Final = Verdict(
    Reason.AUTH_REQUIRED,
    "SOCKS5 client offered no acceptable authentication method (username/password required)",
)


class Handshake:
    """One SOCKS5 client's handshake, sans I/O.

    `receive(buf)` parses what it can of the client's bytes, in order: the greeting (the
    method is answered at once), the RFC 1929 credentials when that method was chosen (the
    client identified through the gate, then counted by `cap`, the per-client cap), then the
    CONNECT request. It returns how many bytes it used and the bytes to write back; once the
    handshake is over, admitted or refused, `intent` holds it, and bytes after it (a TLS
    ClientHello already sent) are left for the tunnel.
    """

    __slots__ = (
        "_cap",
        "_gate",
        "_method",
        "bound",
        "client",
        "identity",
        "intent",
        "peer",
        "requested",
        "t0",
    )

    def __init__(
        self,
        gate: Gate,
        client: str,
        peer: object,
        bound: Identity | None,
        t0: int,
        *,
        cap: Callable[[Identity | Verdict], Verdict | None],
    ) -> None:
        self._gate = gate
        self._cap = cap
        self.client, self.peer, self.bound, self.t0 = client, peer, bound, t0
        self._method: int | None = None  # chosen, once the greeting was read
        self.identity: Identity | None = None  # once identified
        self.intent: Intent | None = None  # once the handshake is over
        self.requested = False  # the CONNECT request was read: past the hello phase

    def receive(self, buf: bytes | bytearray, *, audit_ok: bool = True) -> tuple[int, bytes]:
        """Consume the messages complete in `buf`: (bytes used, bytes to answer)."""
        used, out = 0, bytearray()
        try:
            while self.intent is None:
                step = self._step(buf[used:], out, audit_ok)
                if step == 0:
                    break
                used += step
        except codec.SocksError as exc:
            refusal = Verdict(reason_of(exc.reason), str(exc))
            self.intent = self._refused(refusal, self.identity, answerable=exc.reply is not None)
        return used, bytes(out)

    def _step(self, data: bytes | bytearray, out: bytearray, audit_ok: bool) -> int:
        """One message, if complete in `data`: the bytes it used (0: not yet)."""
        if self._method is None:
            greeting = codec.parse_greeting(data)
            if greeting is None:
                return 0
            require = self._gate.clients.require_auth and self.bound is None
            self._method = codec.choose_method(greeting[0], require)
            out += codec.method_reply(self._method)
            if self._method == codec.METHOD_UNACCEPTABLE:
                self.intent = self._refused(None, NO_METHOD)
            elif self._method == codec.METHOD_NONE:
                self._identify(None, out)
            return greeting[1]
        if self.identity is None:
            creds = codec.parse_credentials(data)
            if creds is None:
                return 0
            pair = f"{creds[0].username}:{creds[0].password}".encode()
            self._identify("Basic " + base64.b64encode(pair).decode("ascii"), out)
            return creds[1]
        request = codec.parse_request(data)
        if request is None:
            return 0
        self.requested = True
        self.intent = self._requested(request[0], self.identity, audit_ok)
        return request[1]

    def _identify(self, authorization: str | None, out: bytearray) -> None:
        found = self._gate.identify_credential(self.bound, self.peer, authorization)
        cap = self._cap(found)
        if self._method == codec.METHOD_USERPASS:
            out += codec.auth_reply(isinstance(found, Identity) and cap is None)
        if isinstance(found, Verdict) or cap is not None:
            self.intent = self._refused(None, found, cap=cap)
        else:
            self.identity = found

    def _refused(
        self,
        target: Verdict | None,
        identity: Identity | Verdict | None,
        *,
        cap: Verdict | None = None,
        answerable: bool = False,
    ) -> Intent:
        """Refused before a request named its target (or with a request that is malformed)."""
        client, t0 = self.client, self.t0
        return Intent(
            client, "CONNECT", "https", "", 0, t0, target, identity, cap, answerable=answerable
        )

    def _requested(self, request: codec.Request, identity: Identity, audit_ok: bool) -> Intent:
        """The CONNECT request: its target (the gate's own parse of a name the agent chose)."""
        # a name the agent chose: escaped until normalized, so a raw newline or ANSI escape
        # never reaches stderr, a summary or on_decision (docs/threat-model.md)
        host = printable(request.host)
        target: Target | Verdict
        try:
            target = make_target("https", request.host, request.port)
        except TargetError as exc:
            target = refuse_request(printable(str(exc)))
        client, port, t0 = self.client, request.port, self.t0
        return Intent(
            client, "CONNECT", "https", host, port, t0, target, identity, audit_ok=audit_ok
        )


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


__all__ = ["NO_METHOD", "Handshake", "serve_socks"]

"""The SOCKS5 front-end: its handshake into an `Intent`, and RFC 1928 replies, one per `Reason`.

Pure. `Handshake` is the greeting, the RFC 1929 credentials and the CONNECT request as a
sans-I/O state machine (bytes in, bytes to answer out, then the `Intent`), so every stage of
it is tested without a socket; `serve.py` only moves its bytes. The table names every reason
(a test proves it), so no refusal quietly becomes a "general failure": a reason that has no
closer RFC 1928 code says so here. Records are CONNECT records with `mode: socks5` and
`socks_reply` (docs/proxy.md#transparent-mode-and-socks5).
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping
from typing import Final

from ....errors import TargetError
from ....policy.target import Target, make_target
from ....printable import printable
from ....reasons import Reason, reason_of
from ...codec import socks5 as codec
from ...core.actions import Refuse
from ...core.clients import Identity
from ...core.gate import Gate, Verdict, refuse_request
from ...core.intent import Answer, Front, Intent


def _reply(code: int) -> Answer:
    return Answer("socks5", code)


NOT_ALLOWED: Final = _reply(codec.REP_NOT_ALLOWED)
HOST_UNREACHABLE: Final = _reply(codec.REP_HOST_UNREACHABLE)
GENERAL_FAILURE: Final = _reply(codec.REP_GENERAL_FAILURE)
SUCCEEDED: Final = _reply(codec.REP_SUCCEEDED)

R = Reason
SOCKS5_ANSWERS: Final[Mapping[Reason, Answer]] = {
    # verdicts that let a connection through: never a refusal
    R.ALLOW_RULE: SUCCEEDED,
    R.DEFAULT_ALLOW: SUCCEEDED,
    R.FRAMEWORK_ROUTE: SUCCEEDED,
    R.ADDRESS_RULES: SUCCEEDED,
    # the policy and the guard: "connection not allowed by ruleset"
    R.BLOCK_RULE: NOT_ALLOWED,
    R.DEFAULT_DENY: NOT_ALLOWED,
    R.PORT_NOT_ALLOWED: NOT_ALLOWED,
    R.RESERVED_ADDRESS: NOT_ALLOWED,
    R.SNI_MISMATCH: NOT_ALLOWED,  # after the reply: the tunnel is closed, nothing more said
    R.SNI_MISSING: NOT_ALLOWED,
    R.AUTH_REQUIRED: NOT_ALLOWED,  # refused at RFC 1929 authentication, before a request
    R.AUTH_FAILED: NOT_ALLOWED,
    R.NOT_A_NAME: NOT_ALLOWED,
    # the destination
    R.DNS_ERROR: HOST_UNREACHABLE,
    R.DNS_TIMEOUT: GENERAL_FAILURE,  # RFC 1928 has no "lookup timed out"
    R.CONNECTION_REFUSED: _reply(codec.REP_CONNECTION_REFUSED),
    R.CONNECTION_TIMEOUT: HOST_UNREACHABLE,
    R.UPSTREAM_ERROR: GENERAL_FAILURE,
    # the request itself
    R.BAD_REQUEST: GENERAL_FAILURE,
    R.HEAD_TOO_LARGE: GENERAL_FAILURE,
    R.HEAD_TIMEOUT: GENERAL_FAILURE,
    R.COMMAND_NOT_SUPPORTED: _reply(codec.REP_COMMAND_NOT_SUPPORTED),
    R.ADDRESS_TYPE_NOT_SUPPORTED: _reply(codec.REP_ATYP_NOT_SUPPORTED),
    # the proxy's own limits and health: "general SOCKS server failure"
    R.TOO_MANY_CONNECTIONS: GENERAL_FAILURE,
    R.AUDIT_UNAVAILABLE: GENERAL_FAILURE,
    R.IDENTIFY_TIMEOUT: GENERAL_FAILURE,
    R.EVICTED: GENERAL_FAILURE,
    # other listeners' reasons: never on a SOCKS5 listener
    R.NOT_REDIRECTED: GENERAL_FAILURE,
    R.POOL_EXHAUSTED: GENERAL_FAILURE,
    R.SANDBOX_ADDED: GENERAL_FAILURE,
    R.SANDBOX_REPLACED: GENERAL_FAILURE,
    R.SANDBOX_REMOVED: GENERAL_FAILURE,
    R.LISTENER_PROBE: GENERAL_FAILURE,
}

SOCKS5: Final = Front("socks5", "socks5", "tunnel", SUCCEEDED, SOCKS5_ANSWERS)


def render_refusal(action: Refuse) -> bytes:
    """The RFC 1928 reply of a refusal (empty after the success reply: just close)."""
    if action.answer.style != "socks5":
        return b""
    return codec.reply(action.answer.code)


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


__all__ = ["NO_METHOD", "SOCKS5", "SOCKS5_ANSWERS", "Handshake", "render_refusal"]

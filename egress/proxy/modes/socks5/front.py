"""The SOCKS5 front-end: RFC 1928 replies, one per `Reason`, written out in full.

Pure. The table names every reason (a test proves it), so no refusal quietly becomes a
"general failure": a reason that has no closer RFC 1928 code says so here. Records are CONNECT
records with `mode: socks5` and `socks_reply` (docs/proxy.md#transparent-mode-and-socks5).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from ....reasons import Reason
from ...codec import socks5 as codec
from ...core.actions import Refuse
from ...core.intent import Answer, Front


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


def render_ok() -> bytes:
    return codec.reply(codec.REP_SUCCEEDED)


__all__ = ["SOCKS5", "SOCKS5_ANSWERS", "render_ok", "render_refusal"]

"""Sans-I/O SOCKS5: RFC 1928 CONNECT and RFC 1929 username/password. Pure.

Strategy, as for `wire`: each parser takes the bytes received so far and returns the parsed
message with the number of bytes it used, `None` ("need more"), or raises `SocksError`. Its
fuzz invariant: parse it or raise our protocol error, nothing else. The messages are tiny and
bounded by the protocol itself (a greeting is at most 2 + 255 bytes, an RFC 1929 request
2 + 255 + 1 + 255, a CONNECT request 4 + 1 + 255 + 2), so no extra size limit is needed: a
buffer that grew past those sizes without parsing is impossible.

Only CONNECT is served (BIND and UDP ASSOCIATE answer 0x07); the proxy resolves names itself
(socks5h semantics), so an ATYP 0x03 name is judged, resolved and guarded exactly like a
CONNECT authority, and an IP literal (ATYP 0x01/0x04) goes through the same guard.
See docs/proxy.md#transparent-mode-and-socks5.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from ...errors import ProtocolError

VERSION = 5
AUTH_VERSION = 1  # RFC 1929 sub-negotiation version
METHOD_NONE = 0x00
METHOD_USERPASS = 0x02
METHOD_UNACCEPTABLE = 0xFF
CMD_CONNECT = 0x01
ATYP_IPV4 = 0x01
ATYP_DOMAIN = 0x03
ATYP_IPV6 = 0x04

# RFC 1928 section 6 reply codes
REP_SUCCEEDED = 0x00
REP_GENERAL_FAILURE = 0x01
REP_NOT_ALLOWED = 0x02
REP_NETWORK_UNREACHABLE = 0x03
REP_HOST_UNREACHABLE = 0x04
REP_CONNECTION_REFUSED = 0x05
REP_TTL_EXPIRED = 0x06
REP_COMMAND_NOT_SUPPORTED = 0x07
REP_ATYP_NOT_SUPPORTED = 0x08

# Audit reason code -> SOCKS reply (docs/audit-log.md lists the reasons). Anything not named
# here is a general failure.
REPLY_FOR_REASON: dict[str, int] = {
    "block_rule": REP_NOT_ALLOWED,
    "default_deny": REP_NOT_ALLOWED,
    "port_not_allowed": REP_NOT_ALLOWED,
    "reserved_address": REP_NOT_ALLOWED,
    "dns_error": REP_HOST_UNREACHABLE,
    "connection_timeout": REP_HOST_UNREACHABLE,
    "connection_refused": REP_CONNECTION_REFUSED,
    "command_not_supported": REP_COMMAND_NOT_SUPPORTED,
    "address_type_not_supported": REP_ATYP_NOT_SUPPORTED,
}


class SocksError(ProtocolError):
    """A malformed or unsupported SOCKS5 message.

    `reply` is the RFC 1928 reply code to answer a request with, or None when the message came
    before a request could be answered (greeting, authentication): then the connection is
    simply closed. `reason` is the audit reason code.
    """

    def __init__(self, message: str, reply: int | None, reason: str = "bad_request") -> None:
        super().__init__(message, 400)
        self.reply = reply
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Greeting:
    """The client's method offer (RFC 1928 section 3)."""

    methods: frozenset[int]


@dataclass(frozen=True, slots=True)
class Credentials:
    """RFC 1929 username/password: the password carries the client token, the username may
    carry the client id (it is informational only)."""

    username: str
    password: str

    def __repr__(self) -> str:  # never show the token
        return f"Credentials(username={self.username!r}, password=<redacted>)"


@dataclass(frozen=True, slots=True)
class Request:
    """A CONNECT request (RFC 1928 section 4). `host` is the name or the IP literal as text,
    not yet normalized (target.make_target does that)."""

    atyp: int
    host: str
    port: int


def parse_greeting(buf: bytes | bytearray) -> tuple[Greeting, int] | None:
    """VER NMETHODS METHODS...; raise SocksError for another version or no methods."""
    if not buf:
        return None
    if buf[0] != VERSION:
        raise SocksError(f"not SOCKS5 (version byte {buf[0]:#04x})", None)
    if len(buf) < 2:
        return None
    n = buf[1]
    if n == 0:
        raise SocksError("SOCKS5 greeting offers no authentication method", None)
    if len(buf) < 2 + n:
        return None
    return Greeting(frozenset(buf[2 : 2 + n])), 2 + n


def choose_method(greeting: Greeting, require_auth: bool) -> int:
    """Username/password when offered (it names the client), else none unless required."""
    if METHOD_USERPASS in greeting.methods:
        return METHOD_USERPASS
    if METHOD_NONE in greeting.methods and not require_auth:
        return METHOD_NONE
    return METHOD_UNACCEPTABLE


def method_reply(method: int) -> bytes:
    return bytes((VERSION, method))


def parse_credentials(buf: bytes | bytearray) -> tuple[Credentials, int] | None:
    """VER ULEN UNAME PLEN PASSWD (RFC 1929); raise SocksError for another version or text
    that is not UTF-8."""
    if not buf:
        return None
    if buf[0] != AUTH_VERSION:
        raise SocksError(f"RFC 1929 version byte {buf[0]:#04x} is not 0x01", None)
    if len(buf) < 2:
        return None
    ulen = buf[1]
    if len(buf) < 3 + ulen:
        return None
    plen = buf[2 + ulen]
    end = 3 + ulen + plen
    if len(buf) < end:
        return None
    try:
        user = bytes(buf[2 : 2 + ulen]).decode("utf-8")
        password = bytes(buf[3 + ulen : end]).decode("utf-8")
    except UnicodeDecodeError:
        raise SocksError("SOCKS5 username or password is not UTF-8", None) from None
    return Credentials(user, password), end


def auth_reply(ok: bool) -> bytes:
    return bytes((AUTH_VERSION, 0 if ok else 1))


def parse_request(buf: bytes | bytearray) -> tuple[Request, int] | None:
    """VER CMD RSV ATYP DST.ADDR DST.PORT; raise SocksError with the reply code to send.

    The whole request is read before an unsupported command is refused, so the refusal can
    name the destination in the audit record.
    """
    if len(buf) < 4:
        if buf and buf[0] != VERSION:
            raise SocksError(f"not SOCKS5 (version byte {buf[0]:#04x})", REP_GENERAL_FAILURE)
        return None
    ver, cmd, rsv, atyp = buf[0], buf[1], buf[2], buf[3]
    if ver != VERSION:
        raise SocksError(f"not SOCKS5 (version byte {ver:#04x})", REP_GENERAL_FAILURE)
    if rsv != 0:
        raise SocksError(f"SOCKS5 reserved byte is {rsv:#04x}, not 0", REP_GENERAL_FAILURE)
    parsed = _parse_address(buf, atyp)
    if parsed is None:
        return None
    host, end = parsed
    port = int.from_bytes(buf[end - 2 : end], "big")
    request = Request(atyp, host, port)
    if cmd != CMD_CONNECT:
        raise SocksError(
            f"SOCKS5 command {cmd:#04x} not supported (only CONNECT)",
            REP_COMMAND_NOT_SUPPORTED,
            "command_not_supported",
        )
    if port == 0:
        raise SocksError("SOCKS5 request for port 0", REP_GENERAL_FAILURE)
    return request, end


def _parse_address(buf: bytes | bytearray, atyp: int) -> tuple[str, int] | None:
    """The address text and the end offset of the request (port included), or None."""
    if atyp == ATYP_IPV4:
        end = 4 + 4 + 2
        if len(buf) < end:
            return None
        return str(ipaddress.IPv4Address(bytes(buf[4:8]))), end
    if atyp == ATYP_IPV6:
        end = 4 + 16 + 2
        if len(buf) < end:
            return None
        return str(ipaddress.IPv6Address(bytes(buf[4:20]))), end
    if atyp == ATYP_DOMAIN:
        if len(buf) < 5:
            return None
        n = buf[4]
        end = 5 + n + 2
        if len(buf) < end:
            return None
        if n == 0:
            raise SocksError("SOCKS5 request with an empty name", REP_GENERAL_FAILURE)
        try:
            return bytes(buf[5 : 5 + n]).decode("utf-8"), end
        except UnicodeDecodeError:
            raise SocksError("SOCKS5 name is not UTF-8", REP_GENERAL_FAILURE) from None
    raise SocksError(
        f"SOCKS5 address type {atyp:#04x} not supported",
        REP_ATYP_NOT_SUPPORTED,
        "address_type_not_supported",
    )


def serialize_request(host: str, port: int, *, cmd: int = CMD_CONNECT) -> bytes:
    """A client's request (tests and clients): IP literals as ATYP 1/4, names as ATYP 3."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raw = host.encode("utf-8")
        if not 0 < len(raw) < 256:
            raise ValueError(f"SOCKS5 name must be 1-255 bytes: {host!r}") from None
        addr = bytes((ATYP_DOMAIN, len(raw))) + raw
    else:
        addr = bytes((ATYP_IPV4 if ip.version == 4 else ATYP_IPV6,)) + ip.packed
    return bytes((VERSION, cmd, 0)) + addr + port.to_bytes(2, "big")


def reply(code: int, bound: tuple[str, int] | None = None) -> bytes:
    """VER REP RSV ATYP BND.ADDR BND.PORT; `bound` defaults to 0.0.0.0:0 (no information)."""
    host, port = bound or ("0.0.0.0", 0)
    ip = ipaddress.ip_address(host)
    atyp = ATYP_IPV4 if ip.version == 4 else ATYP_IPV6
    return bytes((VERSION, code, 0, atyp)) + ip.packed + port.to_bytes(2, "big")


def reply_for(reason: str) -> int:
    """The SOCKS reply code for an audit reason code (general failure when unnamed)."""
    return REPLY_FOR_REASON.get(reason, REP_GENERAL_FAILURE)


__all__ = [
    "Credentials",
    "Greeting",
    "Request",
    "SocksError",
    "auth_reply",
    "choose_method",
    "method_reply",
    "parse_credentials",
    "parse_greeting",
    "parse_request",
    "reply",
    "reply_for",
    "serialize_request",
]

"""Client identity: which policy applies to a connection or request (SPEC 4).

Pure. A client is identified by a proxy token (`Proxy-Authorization: Basic`, the token being
the password of the proxy URL's userinfo, or the username when the password is empty) or by
its source address. Tokens are compared in constant time (`hmac.compare_digest`, against every
configured token so the loop's length does not depend on which one matched) and never logged.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
from dataclasses import dataclass

from .config import ClientSpec, Settings
from .policy import Policy
from .target import IPAddress


@dataclass(frozen=True, slots=True)
class Identity:
    """Who is asking: `client_id` (None = the proxy's default policy) and their policy."""

    client_id: str | None
    policy: Policy


class AuthError(Exception):
    """407: `reason` is `auth_required` or `auth_failed`."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def basic_token(header: str) -> str | None:
    """The token in a `Basic` credential, or None if the header is not a valid one."""
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "basic" or not value:
        return None
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, sep, password = decoded.partition(":")
    if not sep:
        return None
    return password or user or None


class ClientTable:
    """Maps credentials and source addresses to identities; built once from `Settings`."""

    def __init__(self, settings: Settings, *, require_auth: bool = False) -> None:
        self.default = Identity(None, settings.policy)
        self.by_token = [
            (c.token.encode(), Identity(c.client_id, c.policy)) for c in settings.clients if c.token
        ]
        self.by_source = [
            (net, Identity(c.client_id, c.policy)) for c in settings.clients for net in c.sources
        ]
        self.require_auth = require_auth

    @property
    def trivial(self) -> bool:
        """No per-client policy at all: every request gets the default."""
        return not self.by_token and not self.by_source and not self.require_auth

    def identify(self, source: IPAddress | None, proxy_authorization: str | None) -> Identity:
        """The identity for a request; raise `AuthError` (407) for a missing or wrong token."""
        token = None
        if proxy_authorization is not None:
            token = basic_token(proxy_authorization) or ""
        return self.identify_token(source, token)

    def identify_token(self, source: IPAddress | None, token: str | None) -> Identity:
        """As `identify`, for a token presented as such (a SOCKS5 password); None = no
        credentials were presented, "" = credentials without a token (refused)."""
        if token is not None:
            found = self._match_token(token) if token else None
            if found is None:
                raise AuthError("auth_failed", "proxy credentials not accepted")
            return found
        if self.require_auth:
            raise AuthError("auth_required", "proxy authentication required")
        if source is not None:
            for net, identity in self.by_source:
                if source in net:
                    return identity
        return self.default

    def _match_token(self, token: str) -> Identity | None:
        given = token.encode()
        found: Identity | None = None
        for expected, identity in self.by_token:
            if hmac.compare_digest(given, expected) and found is None:
                found = identity
        return found


def source_address(peername: object) -> IPAddress | None:
    if isinstance(peername, tuple) and peername:
        try:
            return ipaddress.ip_address(str(peername[0]).split("%", 1)[0])
        except ValueError:
            return None
    return None


__all__ = ["AuthError", "ClientSpec", "ClientTable", "Identity", "basic_token"]

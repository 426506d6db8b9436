"""Client identity: which policy applies to a request (docs/proxy.md#clients-tokens-and-407).

Pure. A client is identified by a proxy token (`Proxy-Authorization: Basic`, the token being
the password of the proxy URL's userinfo, or the username when the password is empty) or by
its source address. Tokens are compared in constant time (`hmac.compare_digest`, against every
configured token so the loop's length does not depend on which one matched) and never logged.
"""

from __future__ import annotations

import base64
import hmac
import ipaddress
from dataclasses import dataclass
from typing import Generic, TypeVar

from ...config import ClientSpec, Settings
from ...policy.rules import Policy
from ...policy.target import IPAddress, IPNetwork

Network = IPNetwork
SOURCE_CACHE_MAX = 4096  # source addresses remembered by identity_at_accept, identify_token
R = TypeVar("R")


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
    except ValueError:  # binascii.Error, UnicodeDecodeError, and non-ASCII input (`Basic \xe9`)
        return None
    user, sep, password = decoded.partition(":")
    if not sep:
        return None
    return password or user or None


class ClientError(ValueError):
    """A client cannot be added: its id, token or source addresses belong to another client."""


class ClientTable:
    """Maps credentials and source addresses to identities: one entry per client (sandbox).

    A client has one lifecycle (docs/user-guide.md#sandbox-lifecycle): `add` it, `replace`
    its policy (atomically: the next `identify` sees the new policy, never a mix), `remove`
    it (its token and source addresses stop matching at once). Tokens and source networks
    are unique across clients, so one client can never be identified as another.
    """

    def __init__(self, settings: Settings, *, require_auth: bool = False) -> None:
        self.default = Identity(None, settings.policy)
        self.require_auth = require_auth
        self._specs: dict[str, ClientSpec] = {}
        self._identities: dict[str, Identity] = {}
        self.by_token: list[tuple[bytes, Identity]] = []
        self.by_source: list[tuple[Network, Identity]] = []
        self._at_source: dict[str, Identity | None] = {}  # identity_at_accept's cache
        self._at_addr: dict[IPAddress, Identity | None] = {}  # identify_token's cache
        # bumped by every change of who is who: a decision a connection kept for its next
        # request (`core/kept.py`) holds only while it is unchanged
        self.generation = 0
        for spec in settings.clients:
            self.add(spec)

    @property
    def trivial(self) -> bool:
        """No per-client policy at all: every request gets the default."""
        return not self.by_token and not self.by_source and not self.require_auth

    @property
    def client_ids(self) -> tuple[str, ...]:
        return tuple(self._specs)

    def spec(self, client_id: str) -> ClientSpec | None:
        return self._specs.get(client_id)

    def identity(self, client_id: str) -> Identity | None:
        return self._identities.get(client_id)

    def add(self, spec: ClientSpec) -> Identity:
        """Add a new client; `ClientError` if its id, token or sources are taken."""
        if spec.client_id in self._specs:
            raise ClientError(f"client {spec.client_id!r} already exists (replace it instead)")
        self._check_unique(spec)
        return self._put(spec)

    def put(self, spec: ClientSpec) -> Identity:
        """Add `spec`, or replace the client of the same id (policy, token and sources) at
        once: the old token and sources stop matching in the same step."""
        self._check_unique(spec)
        return self._put(spec)

    def replace(self, client_id: str, policy: Policy) -> Identity:
        """Give an existing client a new policy (same token and sources); `KeyError` if none."""
        old = self._specs[client_id]
        return self._put(ClientSpec(client_id, policy, old.token, old.sources))

    def remove(self, client_id: str) -> ClientSpec | None:
        """Forget a client: its token and sources no longer identify anyone. Idempotent."""
        spec = self._specs.pop(client_id, None)
        self._identities.pop(client_id, None)
        if spec is not None:
            self._rebuild()
        return spec

    def _put(self, spec: ClientSpec) -> Identity:
        identity = Identity(spec.client_id, spec.policy)
        self._specs[spec.client_id] = spec
        self._identities[spec.client_id] = identity
        self._rebuild()
        return identity

    def _check_unique(self, spec: ClientSpec) -> None:
        for other in self._specs.values():
            if other.client_id == spec.client_id:
                continue
            if spec.token and other.token and spec.token == other.token:
                raise ClientError(
                    f"client {spec.client_id!r}: token already used by another client"
                )
            for net in spec.sources:
                clash = next((o for o in other.sources if _overlap(net, o)), None)
                if clash is not None:
                    raise ClientError(
                        f"client {spec.client_id!r}: source {net} overlaps "
                        f"{clash} of client {other.client_id!r}"
                    )

    def _rebuild(self) -> None:
        """New lookup lists swapped in whole (a reader never sees a half-updated table)."""
        specs, ids = self._specs.values(), self._identities
        self.by_token = [(c.token.encode(), ids[c.client_id]) for c in specs if c.token]
        self.by_source = [(net, ids[c.client_id]) for c in specs for net in c.sources]
        self._at_source = {}
        self._at_addr = {}
        self.generation += 1

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
        if source is not None and self.by_source:
            cache = self._at_addr
            if source in cache:
                found = cache[source]
            else:  # one scan per address, not per request (docs/proxy.md#per-sandbox-bounds)
                if len(cache) >= SOURCE_CACHE_MAX:
                    cache.clear()
                found = cache[source] = self._scan(source)
            if found is not None:
                return found
        return self.default

    def identity_at_accept(self, bound: Identity | None, source: str) -> Identity | None:
        """The client of a connection before it sends anything, when that is already known:
        its listener's, or its source address's (`source`: the peer's address text); the
        default client when no token could change it. None: only its first request will
        say (tokens, `require_auth`), so it is counted as unidentified until then
        (docs/proxy.md#limits)."""
        if bound is not None:
            return bound
        if self.require_auth:
            return None
        if self.by_source:
            cache = self._at_source
            if source in cache:
                found = cache[source]
            else:  # one scan per source address, not per connection (a flood reconnects)
                if len(cache) >= SOURCE_CACHE_MAX:
                    cache.clear()
                found = cache[source] = self._source_identity(source)
            if found is not None:
                return found
        return None if self.by_token else self.default

    def _source_identity(self, source: str) -> Identity | None:
        try:
            addr = ipaddress.ip_address(source.split("%", 1)[0])
        except ValueError:
            return None
        return self._scan(addr)

    def _scan(self, addr: IPAddress) -> Identity | None:
        for net, identity in self.by_source:
            if addr in net:
                return identity
        return None

    def _match_token(self, token: str) -> Identity | None:
        given = token.encode()
        found: Identity | None = None
        for expected, identity in self.by_token:
            if hmac.compare_digest(given, expected) and found is None:
                found = identity
        return found


def _overlap(a: Network, b: Network) -> bool:
    return a.version == b.version and a.overlaps(b)


class Leases(Generic[R]):
    """Which sandboxes hold which shared resources (listeners, forwarders): pure reference
    counting, so releasing one sandbox never closes what another still uses
    (docs/user-guide.md#sandbox-lifecycle)."""

    def __init__(self) -> None:
        self._held: dict[str, list[R]] = {}
        self._holders: dict[R, set[str]] = {}

    def hold(self, owner: str, resource: R) -> None:
        """`owner` uses `resource` (idempotent)."""
        holders = self._holders.setdefault(resource, set())
        if owner not in holders:
            holders.add(owner)
            self._held.setdefault(owner, []).append(resource)

    def held(self, owner: str) -> tuple[R, ...]:
        return tuple(self._held.get(owner, ()))

    def holders(self, resource: R) -> frozenset[str]:
        return frozenset(self._holders.get(resource, ()))

    def let_go(self, owner: str, resource: R) -> bool:
        """`owner` stops using `resource`; True if nobody uses it any more (close it)."""
        holders = self._holders.get(resource)
        if holders is None or owner not in holders:
            return False
        holders.discard(owner)
        held = self._held.get(owner, [])
        if resource in held:
            held.remove(resource)
        if not held:
            self._held.pop(owner, None)
        if holders:
            return False
        del self._holders[resource]
        return True

    def drop(self, owner: str) -> list[R]:
        """`owner` lets go of everything; the resources nobody uses any more, to close."""
        return [r for r in self.held(owner) if self.let_go(owner, r)]


def admission_source(source: str, netns: str | None) -> str:
    """The source a connection is counted under for admission (its slots, its fair share):
    its address, except that every loopback source (127.0.0.0/8, ::1, ::ffff:127.x) of one
    network namespace is one source, `loopback` (`netns`: the listener's namespace, None for
    the proxy's own). A loopback connection can only come from that namespace, so from one
    host: one process binding 127.0.0.2, 127.0.0.3, ... would otherwise be as many default
    clients, each with its own connection cap, and could fill the proxy (issue 32;
    docs/proxy.md#connection-slots). Clients named by source rules keep their own identity:
    this is only the default client's key."""
    if source.startswith("127.") or (":" in source and _loopback6(source)):
        return "loopback" if netns is None else f"loopback@{netns}"
    return source


def _loopback6(source: str) -> bool:
    """An IPv6 peer text that is loopback: ::1, or an IPv4-mapped 127.x in any spelling."""
    try:
        addr = ipaddress.IPv6Address(source.split("%", 1)[0])
    except ValueError:
        return False
    mapped = addr.ipv4_mapped
    return addr.is_loopback or (mapped is not None and mapped.is_loopback)


def source_address(peername: object) -> IPAddress | None:
    if isinstance(peername, tuple) and peername:
        try:
            return ipaddress.ip_address(str(peername[0]).split("%", 1)[0])
        except ValueError:
            return None
    return None


__all__ = [
    "AuthError",
    "ClientError",
    "ClientSpec",
    "ClientTable",
    "Identity",
    "Leases",
    "admission_source",
    "basic_token",
]

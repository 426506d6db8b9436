"""Address guard, pure part: is this address reserved, and why.

Strategy: an address is first *unwrapped* — every IPv4 address embedded in an IPv6 one
(mapped `::ffff:0:0/96`, compatible `::/96`, NAT64 `64:ff9b::/96` and `64:ff9b:1::/48`,
6to4 `2002::/16`, Teredo `2001::/32`, ISATAP interface ids) is judged as the IPv4 address it
carries, because that is where a packet to it may end up. Then each candidate is checked
against the reserved ranges in a fixed order, and the first hit names the reason.

We do not trust `ipaddress`'s `is_*` properties alone: `IPv6Address('::ffff:127.0.0.1')
.is_loopback` is False, and `is_private` covers 198.18.0.0/15 (benchmarking) which is a
perfectly routable destination for our users' test hosts.

Reason codes: loopback, unspecified, link_local, multicast, broadcast, reserved, metadata,
host_local, private, reserved_extra.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from .target import IPAddress, IPNetwork


def _nets(*cidrs: str) -> tuple[IPNetwork, ...]:
    return tuple(ipaddress.ip_network(c) for c in cidrs)


# Always reserved (docs/proxy.md#the-address-guard). Order matters only for which reason is named.
_ALWAYS: tuple[tuple[str, tuple[IPNetwork, ...]], ...] = (
    ("loopback", _nets("127.0.0.0/8", "::1/128")),
    ("unspecified", _nets("0.0.0.0/8", "::/128")),
    ("link_local", _nets("169.254.0.0/16", "fe80::/10")),
    ("multicast", _nets("224.0.0.0/4", "ff00::/8")),
    ("broadcast", _nets("255.255.255.255/32")),
    # Class E (RFC 1112 "future use"): never a legitimate destination.
    ("reserved", _nets("240.0.0.0/4")),
    # Cloud metadata endpoints outside link-local (Alibaba, Azure wire server, Oracle/RFC 7723
    # PCP anycast, AWS IPv6 IMDS).
    (
        "metadata",
        _nets("100.100.100.200/32", "168.63.129.16/32", "192.0.0.192/32", "fd00:ec2::254/128"),
    ),
)

ALWAYS_RESERVED = _ALWAYS  # what `reach.py` subtracts from an allow address rule

# Opt-in with `--reserve-private`: RFC 1918, CGNAT (RFC 6598), IPv6 ULA (RFC 4193).
PRIVATE_NETWORKS = _nets(
    "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7"
)

_NAT64_WKP = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
_SIX_TO_FOUR = ipaddress.ip_network("2002::/16")
_TEREDO = ipaddress.ip_network("2001::/32")
_COMPAT = ipaddress.ip_network("::/96")


def embedded_ipv4(addr: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """Every IPv4 address that `addr` may carry (empty if it carries none)."""
    n = int(addr)
    low32 = ipaddress.IPv4Address(n & 0xFFFFFFFF)
    found: list[ipaddress.IPv4Address] = []
    if addr.ipv4_mapped is not None:
        found.append(addr.ipv4_mapped)
    if addr in _COMPAT and n > 1:  # "::" and "::1" are themselves
        found.append(low32)
    if addr in _NAT64_WKP:
        found.append(low32)
    if addr in _NAT64_LOCAL:
        # RFC 6052 2.2: for a /48 prefix the address sits in bits 48-63 and 72-87; an operator
        # may also use the /96 layout under this prefix, so judge both.
        hi16 = (n >> 64) & 0xFFFF
        lo16 = (n >> 40) & 0xFFFF
        found.append(low32)
        found.append(ipaddress.IPv4Address((hi16 << 16) | lo16))
    if addr in _SIX_TO_FOUR:
        found.append(ipaddress.IPv4Address((n >> 80) & 0xFFFFFFFF))
    if addr in _TEREDO:
        found.append(ipaddress.IPv4Address((n >> 64) & 0xFFFFFFFF))  # server
        found.append(ipaddress.IPv4Address(~n & 0xFFFFFFFF))  # client, obfuscated
    iid_hi = (n >> 32) & 0xFFFFFFFF
    if iid_hi in (0x00005EFE, 0x02005EFE):  # ISATAP (RFC 5214)
        found.append(low32)
    return found


def candidates(addr: IPAddress) -> list[IPAddress]:
    """The address itself plus every IPv4 address embedded in it."""
    if isinstance(addr, ipaddress.IPv4Address):
        return [addr]
    out: list[IPAddress] = [addr]
    out.extend(embedded_ipv4(addr))
    return out


@dataclass(frozen=True, slots=True)
class AddressGuard:
    """The configuration of the address guard: what, beyond the always-reserved, to refuse.

    `host_local` holds every address of the proxy's own host interfaces and listeners
    (`hostaddrs.local_addresses()` supplies them); `extra` the `--reserve` CIDRs.

    `exempt` holds exact `(address, port)` endpoints the guard lets through (API only, empty
    by default, not on the command line): an embedding test rig's own upstreams on loopback,
    judged by the policy like any destination, where a framework route would skip the policy
    (docs/proxy.md#the-address-guard). Only that port of that address passes; every other
    port stays reserved (so list upstreams only, never one of the proxy's own listeners).
    """

    host_local: frozenset[IPAddress] = frozenset()
    extra: tuple[IPNetwork, ...] = ()
    reserve_private: bool = False
    exempt: frozenset[tuple[IPAddress, int]] = frozenset()

    def __post_init__(self) -> None:
        """Typed at construction (docs/policy.md#types): reserve_private="false" must not
        reserve, and a string of addresses must not be taken for a set of them."""
        if not isinstance(self.reserve_private, bool):
            raise TypeError(
                f"AddressGuard reserve_private must be a boolean, not {self.reserve_private!r}"
            )
        if not isinstance(self.host_local, frozenset) or not all(
            isinstance(a, ipaddress.IPv4Address | ipaddress.IPv6Address) for a in self.host_local
        ):
            raise TypeError(
                f"AddressGuard host_local must be a frozenset of addresses, not {self.host_local!r}"
            )
        if not isinstance(self.extra, tuple) or not all(
            isinstance(n, ipaddress.IPv4Network | ipaddress.IPv6Network) for n in self.extra
        ):
            raise TypeError(f"AddressGuard extra must be a tuple of networks, not {self.extra!r}")
        if not isinstance(self.exempt, frozenset) or not all(
            isinstance(e, tuple)
            and len(e) == 2
            and isinstance(e[0], ipaddress.IPv4Address | ipaddress.IPv6Address)
            and type(e[1]) is int
            and 0 < e[1] < 65536
            for e in self.exempt
        ):
            raise TypeError(
                f"AddressGuard exempt must be a frozenset of (address, port) pairs, not "
                f"{self.exempt!r}"
            )

    def classify(self, addr: IPAddress) -> str | None:
        """Return the reason code if `addr` is reserved, else None."""
        return classify(addr, self)

    def check(
        self, addrs: Iterable[IPAddress], port: int | None = None
    ) -> tuple[IPAddress, str] | None:
        """The first reserved address among `addrs` and its reason, or None if all pass.

        With `port`, an `exempt` endpoint `(addr, port)` passes."""
        for addr in addrs:
            if port is not None and (addr, port) in self.exempt:
                continue
            reason = classify(addr, self)
            if reason is not None:
                return addr, reason
        return None

    def with_host_local(self, addrs: Iterable[IPAddress]) -> AddressGuard:
        return replace(self, host_local=self.host_local | frozenset(addrs))


def classify(addr: IPAddress, guard: AddressGuard | None = None) -> str | None:
    """Return why `addr` is reserved (a reason code), or None if it may be dialed."""
    guard = guard or AddressGuard()
    for cand in candidates(addr):
        reason = _classify_one(cand, guard)
        if reason is not None:
            return reason
    return None


def _classify_one(addr: IPAddress, guard: AddressGuard) -> str | None:
    for reason, nets in _ALWAYS:
        if _in_any(addr, nets):
            return reason
    if addr in guard.host_local:
        return "host_local"
    if guard.reserve_private and _in_any(addr, PRIVATE_NETWORKS):
        return "private"
    if _in_any(addr, guard.extra):
        return "reserved_extra"
    return None


def _in_any(addr: IPAddress, nets: Sequence[IPNetwork]) -> bool:
    return any(addr in net for net in nets)


def parse_cidr(text: str) -> IPNetwork:
    """Parse a `--reserve` CIDR (or single address); ValueError with the culprit quoted."""
    try:
        return ipaddress.ip_network(text.strip().replace("[", "").replace("]", ""), strict=False)
    except ValueError as exc:
        raise ValueError(f"invalid CIDR {text!r}: {exc}") from None

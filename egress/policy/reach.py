"""Which (scheme, port) pairs an allow address rule could still open to a *name*.

Pure. Strategy: a name is resolved only when its addresses could change a refusal into an
allow (docs/policy.md#no-lookup-decides-nothing). Allow address rules reach names only under
the opt-in `resolve_names_for_address_rules`; even then a rule counts only for the schemes and
ports it covers, and only if some address inside it survives the block address rules for
that port and the address guard. This module computes that answer once per policy (blocks)
and once per policy and guard (reserved ranges), so a decision asks one set membership, never
a scan of the rules.

The answer may over-approximate, never under-approximate: a rule is dropped only when every
address in it is blocked or reserved. It is exact for IPv4 and for IPv6 outside the prefixes
that embed IPv4 (`64:ff9b::/96`, `2002::/16`, ...; the guard judges the IPv4 inside those), where
a rule whose embedded addresses are all reserved still counts: that costs a lookup, never an
allow.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from .addrs import ALWAYS_RESERVED, PRIVATE_NETWORKS, AddressGuard
from .target import DEFAULT_PORTS, IPAddress, IPNetwork, Scheme

if TYPE_CHECKING:
    from .grammar import Rule

Pair = tuple[Scheme, int]
_SCHEMES: Final[tuple[Scheme, ...]] = ("http", "https")


@dataclass(frozen=True, slots=True)
class Reach:
    """The (scheme, port) pairs on which some allow address rule could admit a name's
    addresses: every pair when `any_port`, else the pairs listed. `rules` are those rules."""

    rules: tuple[Rule, ...] = ()
    any_port: bool = False
    pairs: frozenset[Pair] = frozenset()
    closed: frozenset[Pair] = frozenset()  # where no every-port rule is open (port blocks)

    def covers(self, scheme: Scheme, port: int) -> bool:
        """Could a name's addresses be allowed on this scheme and port? (two set lookups)"""
        pair = (scheme, port)
        return (self.any_port and pair not in self.closed) or pair in self.pairs

    @property
    def empty(self) -> bool:
        """No address could ever admit a name: no name is resolved for address rules."""
        return not self.any_port and not self.pairs


NOWHERE: Final = Reach()


def rule_pairs(rule: Rule) -> frozenset[Pair] | None:
    """The (scheme, port) pairs an allow rule covers; None for every pair (`:*`)."""
    if rule.any_port:
        return None
    if rule.scheme is not None and rule.port is not None:
        return frozenset({(rule.scheme, rule.port)})
    if rule.port is not None:
        return frozenset((s, rule.port) for s in _SCHEMES)
    return frozenset((s, DEFAULT_PORTS[s]) for s in _SCHEMES)


def address_reach(
    allows: Sequence[Rule], blocks: Sequence[Rule], guard: AddressGuard | None = None
) -> Reach:
    """The reach of allow address rules `allows` past block address rules `blocks` and, when
    given, the address `guard` (its reserved ranges, less its exempt endpoints)."""
    reserved = _reserved_networks(guard) if guard is not None else ()
    live: list[Rule] = []
    any_port = False
    pairs: set[Pair] = set()
    closed: set[Pair] | None = None  # pairs every open every-port rule is closed on
    every = [b.network for b in blocks if _blocks_all(b)]
    port_blocks = {p for b in blocks if not _blocks_all(b) for p in _block_pairs(b)}
    for rule in allows:
        net = rule.network
        if net is None:
            continue
        covered = rule_pairs(rule)
        if covered is None and not _dead(net, every, reserved, guard):
            # open on every port but those whose own block rules close it
            shut = {p for p in port_blocks if not _open(rule, p, blocks, reserved, guard)}
            closed = shut if closed is None else closed & shut
            any_port = True
            live.append(rule)
            continue
        if covered is None:  # dead on every port: only an exempt endpoint can pass
            covered = frozenset((s, port) for s in _SCHEMES for _, port in _exempt(net, guard))
        opened = {p for p in covered if _open(rule, p, blocks, reserved, guard)}
        if opened:
            pairs |= opened
            live.append(rule)
    return Reach(tuple(live), any_port, frozenset(pairs), frozenset(closed or ()))


def _block_pairs(rule: Rule) -> frozenset[Pair]:
    """The pairs a block rule with a port covers."""
    if rule.scheme is not None and rule.port is not None:
        return frozenset({(rule.scheme, rule.port)})
    assert rule.port is not None
    return frozenset((s, rule.port) for s in _SCHEMES)


def _open(
    rule: Rule,
    pair: Pair,
    blocks: Sequence[Rule],
    reserved: Sequence[IPNetwork],
    guard: AddressGuard | None,
) -> bool:
    """Could some address of `rule` pass the blocks and the guard on `pair`?"""
    net = rule.network
    assert net is not None
    if not rule.covers_port(*pair):
        return False
    cover = [b.network for b in blocks if b.covers_port(*pair)]
    if not _dead(net, cover, reserved, guard):
        return True
    # every address is blocked or reserved: only an exempt endpoint on this port can pass
    return any(
        port == pair[1] and not _inside(ipaddress.ip_network(addr), cover)
        for addr, port in _exempt(net, guard)
    )


def _dead(
    net: IPNetwork,
    cover: Sequence[IPNetwork | None],
    reserved: Sequence[IPNetwork],
    guard: AddressGuard | None,
) -> bool:
    """Is every address of `net` blocked (`cover`) or reserved by the guard?"""
    if net.num_addresses == 1 and guard is not None:
        # one address: the guard's own judgement (it unwraps IPv4 embedded in IPv6)
        if guard.classify(net.network_address) is not None:
            return True
        return _inside(net, cover)
    return _inside(net, [*cover, *reserved])


def _exempt(net: IPNetwork, guard: AddressGuard | None) -> list[tuple[IPAddress, int]]:
    """The guard's exempt endpoints inside `net`."""
    if guard is None:
        return []
    return [(addr, port) for addr, port in guard.exempt if addr in net]


def _blocks_all(rule: Rule) -> bool:
    """A block rule on every port and scheme (no port, or `:*`)."""
    return rule.any_port or (rule.port is None and rule.scheme is None)


def _reserved_networks(guard: AddressGuard) -> tuple[IPNetwork, ...]:
    nets: list[IPNetwork] = [n for _, group in ALWAYS_RESERVED for n in group]
    if guard.reserve_private:
        nets.extend(PRIVATE_NETWORKS)
    nets.extend(guard.extra)
    nets.extend(ipaddress.ip_network(a) for a in guard.host_local)
    return tuple(nets)


def _inside(net: IPNetwork, cover: Iterable[IPNetwork | None]) -> bool:
    """Is every address of `net` inside the union of `cover`? Collapsing merges sibling
    prefixes, so a union that covers the (aligned) `net` holds one supernet of it."""
    same = [c for c in cover if c is not None and c.version == net.version]
    if not same:
        return False
    merged = ipaddress.collapse_addresses(same)  # type: ignore[type-var]
    return any(net.subnet_of(m) for m in merged)  # type: ignore[arg-type]


__all__ = ["NOWHERE", "Reach", "address_reach", "rule_pairs"]

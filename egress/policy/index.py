"""Compiled rule sets: the indexes that make matching a host or an address fast.

Pure. Patterns are compiled once, when a `Policy` is built: exact names go to a dict,
`*.suffix` patterns to a suffix dict (a name is looked up under each of its parent
domains), only the rest to compiled regular expressions; address rules are indexed by
prefix length. Matches come back in definition order (docs/policy.md).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .grammar import Rule
    from .target import IPAddress


class NetIndex:
    """Address rules indexed by prefix length: which rules contain an address, in
    O(distinct prefix lengths) dict lookups instead of a scan of every CIDR rule."""

    __slots__ = ("_tables",)

    def __init__(self) -> None:
        # version -> prefix length -> network number -> rules
        self._tables: dict[int, dict[int, dict[int, list[Rule]]]] = {4: {}, 6: {}}

    def add(self, rule: Rule) -> None:
        net = rule.network
        assert net is not None
        bits = net.max_prefixlen
        key = int(net.network_address) >> (bits - net.prefixlen)
        self._tables[net.version].setdefault(net.prefixlen, {}).setdefault(key, []).append(rule)

    def containing(self, ip: IPAddress) -> list[Rule]:
        """Every rule whose network contains `ip` (unordered)."""
        n, bits = int(ip), ip.max_prefixlen
        found: list[Rule] = []
        for plen, table in self._tables[ip.version].items():
            hit = table.get(n >> (bits - plen))
            if hit:
                found.extend(hit)
        return found


@dataclass(slots=True)
class RuleSet:
    """Rules of one action, indexed for fast host matching."""

    exact: dict[str, list[Rule]] = field(default_factory=dict)
    suffix: dict[str, list[Rule]] = field(default_factory=dict)  # "*.x" -> under "x"
    regex: list[tuple[re.Pattern[str], Rule]] = field(default_factory=list)
    networks: list[Rule] = field(default_factory=list)
    net_index: NetIndex = field(default_factory=NetIndex)
    order: dict[Rule, int] = field(default_factory=dict)

    def add(self, rule: Rule) -> None:
        self.order.setdefault(rule, len(self.order))
        if rule.network is not None:
            self.networks.append(rule)
            self.net_index.add(rule)
            return
        assert rule.pattern is not None
        pat = rule.pattern
        if "*" not in pat and "?" not in pat:
            self.exact.setdefault(pat, []).append(rule)
        elif pat.startswith("*.") and "*" not in pat[2:] and "?" not in pat[2:]:
            self.suffix.setdefault(pat[2:], []).append(rule)
        else:
            rx = re.compile(fnmatch.translate(pat))
            self.regex.append((rx, rule))
            if pat.startswith("*."):
                # a leading "*." also matches the apex
                self.regex.append((re.compile(fnmatch.translate(pat[2:])), rule))

    def network_matches(self, ips: Sequence[IPAddress], *, every: bool) -> list[Rule]:
        """Address rules containing any (`every=False`) or every (`every=True`) of `ips`, in
        definition order."""
        if not ips or not self.networks:
            return []
        sets = [set(self.net_index.containing(ip)) for ip in ips]
        chosen = set.intersection(*sets) if every else set.union(*sets)
        return sorted(chosen, key=self.order.__getitem__)

    def host_matches(self, host: str) -> list[Rule]:
        """Every host-form rule whose pattern matches `host`, in definition order."""
        found = list(self.exact.get(host, ()))
        if self.suffix:
            name = host
            while True:
                found.extend(self.suffix.get(name, ()))
                dot = name.find(".")
                if dot < 0:
                    break
                name = name[dot + 1 :]
        for rx, rule in self.regex:
            if rx.match(host) and rule not in found:
                found.append(rule)
        if len(found) > 1:
            found.sort(key=self.order.__getitem__)
        return found


__all__ = ["NetIndex", "RuleSet"]

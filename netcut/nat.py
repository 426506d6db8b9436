"""Transparent mode's redirects: chain NETCUT_REDIRECT in the nat table, jumped to first
from OUTPUT (IPv4 only; a cut disables IPv6). See redirect.py for the rules and why.

Runs *inside* the target namespace only (netcut's worker process), like backstop.py and for
the same reasons: a fresh table handle per job, one commit per install/remove. The nat table
is opened only for a transparent cut, or when this namespace already registered it (opening
a table registers it, and `status` must not change the namespace it reads).
"""

from __future__ import annotations

from typing import Any

import iptc

from netcut.backstop import _OnlyTable, _registered
from netcut.model import NAT_CHAIN
from netcut.ops import NatRule

_NAT = "nat"


def _table() -> Any:
    iptc.Table._cache.pop(_NAT, None)
    iptc.Chain._cache.clear()
    return iptc.Table(_NAT, autocommit=False)


def build_rule(spec: NatRule) -> Any:
    rule = iptc.Rule()
    if spec.dst:
        rule.dst = spec.dst
    if spec.dst_local:
        rule.create_match("addrtype").dst_type = "LOCAL"
    if spec.proto:
        rule.protocol = spec.proto
    if spec.dport is not None:
        rule.create_match(spec.proto or "tcp").dport = str(spec.dport)
    target = rule.create_target(spec.verdict)
    if spec.verdict == "REDIRECT":
        target.to_ports = str(spec.to_port)
    return rule


class _Jump(_OnlyTable, iptc.Rule):  # type: ignore[misc]
    pass


def _jump(table: Any) -> Any:
    rule = _Jump()
    rule.only = table
    rule.create_target(NAT_CHAIN)
    return rule


def install(rules: tuple[NatRule, ...]) -> None:
    """Create (or refill) chain NETCUT_REDIRECT with `rules`, jumped to first from OUTPUT."""
    table = _table()
    if table.is_chain(NAT_CHAIN):
        _remove_jumps(table)
        table.flush_entries(NAT_CHAIN)
    else:
        table.create_chain(NAT_CHAIN)
    chain = iptc.Chain(table, NAT_CHAIN)
    for spec in rules:
        chain.append_rule(build_rule(spec))
    iptc.Chain(table, "OUTPUT").insert_rule(_jump(table))
    table.commit()


def remove() -> None:
    """Remove the jumps from OUTPUT and chain NETCUT_REDIRECT; nothing to do when absent."""
    if not present():
        return
    table = _table()
    _remove_jumps(table)
    table.flush_entries(NAT_CHAIN)
    table.delete_chain(NAT_CHAIN)
    table.commit()


def _remove_jumps(table: Any) -> None:
    output = iptc.Chain(table, "OUTPUT")
    while True:
        try:
            output.delete_rule(_jump(table))
        except iptc.IPTCError:
            return


def present() -> bool:
    """Does this namespace's nat table hold chain NETCUT_REDIRECT? (Never registers it.)"""
    return _NAT in _registered("ip_tables_names") and bool(_table().is_chain(NAT_CHAIN))

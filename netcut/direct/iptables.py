"""The iptables backend (netfilter.py's `Netfilter`), driven through python-iptables:
the backstop is chain NETCUT in the filter table (iptables and ip6tables), the redirects
chain NETCUT_REDIRECT in the nat table (IPv4), each jumped to first from OUTPUT
(iptables_text.py holds the rule language both modes share).

Runs *inside* the target namespace only (netcut's worker process, see direct/worker.py):
python-iptables has no namespace support and caches Table objects process-wide, and libiptc
binds a table handle to the namespace of the socket it opened. Each function here therefore
drops the cached table and opens a fresh one, and each install/remove is a single commit
(atomic per family). The filter tables are opened only when needed, and the nat table only
for a transparent cut or when this namespace already registered it: opening a table
registers it, and `status` must not change the namespace it reads.

`prewarm()` runs once when the worker starts, in its own namespace: it loads the xtables
extensions (tcp, udp, REJECT) and builds the fixed rules without opening any table.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import iptc

from netcut.direct.kernelstate import PROC_NET
from netcut.iptables_text import CHAIN, NAT_CHAIN, TARGETS, SeenRule, seen_backstop
from netcut.plan.model import AF_INET, AF_INET6, OutputRule, RedirectRule, SeenBackstop
from netcut.plan.planner import backstop_rules

_FILTER = "filter"
_NAT = "nat"


def _table(family: int) -> Any:
    cls = iptc.Table6 if family == AF_INET6 else iptc.Table
    # A handle (and the Chain objects bound to it) opened by an earlier job belongs to another
    # namespace: drop them so the table is opened afresh here.
    cls._cache.pop(_FILTER, None)
    iptc.Chain._cache.clear()
    return cls(_FILTER, autocommit=False)  # a new Table opens (iptc_init) its handle


def _new_rule(family: int) -> Any:
    return iptc.Rule6() if family == AF_INET6 else iptc.Rule()


_built: dict[tuple[int, OutputRule], Any] = {}
# A long-lived worker cuts thousands of sandboxes: the cache keeps the fixed rules and the
# recent keeps, never one entry per address it ever saw (its memory stays flat).
_BUILT_MAX = 512


def cached_rule(family: int, spec: OutputRule) -> Any:
    """A rule depends on no namespace: build it once per process (xtables option parsing
    through ctypes is most of a backstop commit's cost), append copies of it anywhere.
    The answer is the rule's entry as libiptc takes it, already checked by its extensions
    (`final_check`): appending it copies these bytes, with no Python per rule."""
    key = (family, spec)
    if key not in _built:
        if len(_built) >= _BUILT_MAX:  # kept addresses differ per sandbox: stay bounded
            _built.clear()
            prewarm()
        _built[key] = _entry(build_rule(family, spec))
    return _built[key]


def _entry(rule: Any) -> Any:
    """The rule's final entry (what Chain.append_rule hands libiptc, built once)."""
    rule.final_check()
    return rule.rule


def build_rule(family: int, spec: OutputRule) -> Any:
    rule = _new_rule(family)
    if spec.out_iface:
        rule.out_interface = spec.out_iface
    if spec.dst_local:  # transparent mode: loopback only to local destinations
        rule.create_match("addrtype").dst_type = "LOCAL"
    if spec.dst:
        rule.dst = spec.dst
    if spec.proto:
        rule.protocol = spec.proto
    if spec.dport is not None:
        match = rule.create_match(spec.proto or "tcp")
        match.dport = str(spec.dport)
    target = rule.create_target("REJECT" if spec.verdict == "reset" else TARGETS[spec.verdict])
    if spec.verdict == "reset":
        target.reject_with = "tcp-reset"
    return rule


class _OnlyTable:
    """Mixin for a rule whose target is chain NETCUT. python-iptables resolves a chain-name
    target by asking `rule.tables`, which opens every table (filter, mangle, raw, nat,
    security), so registering them all in the namespace, and caches them process-wide: here
    only the filter table being edited is asked."""

    only: Any = None

    @property
    def tables(self) -> list[Any]:
        return [self.only]


class _Jump4(_OnlyTable, iptc.Rule):  # type: ignore[misc]
    pass


class _Jump6(_OnlyTable, iptc.Rule6):  # type: ignore[misc]
    pass


def _jump(family: int, table: Any) -> Any:
    rule = (_Jump6 if family == AF_INET6 else _Jump4)()
    rule.only = table
    rule.create_target(CHAIN)
    return rule


_jumps: dict[int, Any] = {}


def _jump_entry(family: int, table: Any) -> Any:
    """The jump's entry: it names chain NETCUT, which libiptc resolves in the table it is
    inserted into at commit, so the same bytes serve every namespace."""
    if family not in _jumps:
        _jumps[family] = _entry(_jump(family, table))
    return _jumps[family]


def install(family: int, rules: tuple[OutputRule, ...]) -> None:
    """Create (or refill) chain NETCUT with `rules` and jump to it first from OUTPUT."""
    table = _table(family)
    if table.is_chain(CHAIN):
        _delete_jumps_to(table, CHAIN)
        table.flush_entries(CHAIN)
    else:
        table.create_chain(CHAIN)
    for spec in rules:
        table.append_entry(CHAIN, cached_rule(family, spec))
    table.insert_entry("OUTPUT", _jump_entry(family, table), 0)
    table.commit()


def remove(family: int) -> None:
    """Remove the jumps from OUTPUT and chain NETCUT; nothing to do when absent."""
    table = _table(family)
    if not table.is_chain(CHAIN):
        return
    _delete_jumps_to(table, CHAIN)
    table.flush_entries(CHAIN)
    table.delete_chain(CHAIN)
    table.commit()


def _delete_jumps_to(table: Any, chain: str) -> None:
    """Delete every rule of OUTPUT that jumps to `chain` (netcut's own mark), found by the
    target name libiptc gives each entry and deleted by position: no rule is built or
    decoded (building the jump to delete it by specification was most of a remove's cost)."""
    name, places, place = chain.encode(), [], 0
    entry = table.first_rule("OUTPUT")
    while entry:
        if table.get_target(entry) == name:
            places.append(place)
        entry = table.next_rule(entry)
        place += 1
    for place in reversed(places):
        if table._iptc.iptc_delete_num_entry(b"OUTPUT", place, table._handle) != 1:
            raise iptc.IPTCError(f"can't delete the jump to {chain}: {table.strerror()}")


def read(verify: bool) -> tuple[tuple[int, ...], tuple[SeenBackstop, ...] | None, bool]:
    """The families whose filter table holds chain NETCUT, with `verify` each one's
    backstop decoded (`_dump`), and whether the nat table holds the redirects. A table that
    is not registered in this namespace is not opened (opening one would register it). Each
    registered filter table is opened once for both answers, and the registered names read
    once: a state read's parts come from one look at each table (docs/netcut.md#latency)."""
    names4 = _registered("ip_tables_names")
    families, seen = [], []
    for family in (AF_INET, AF_INET6):
        names = names4 if family == AF_INET else _registered("ip6_tables_names")
        if _FILTER not in names:
            continue
        table = _table(family)
        if table.is_chain(CHAIN):
            families.append(family)
            if verify:
                seen.append(_dump(table, family))
    redirect = _NAT in names4 and bool(_nat_table().is_chain(NAT_CHAIN))
    return tuple(families), tuple(seen) if verify else None, redirect


def _dump(table: Any, family: int) -> SeenBackstop:
    """OUTPUT's rules and chain NETCUT's in `table`, decoded in full (every match and
    target option), in the plan's terms for `status` to compare with the plan."""
    output = _chain_rules(table, "OUTPUT")
    chain = _chain_rules(table, CHAIN) if table.is_chain(CHAIN) else None
    return seen_backstop(family, output, chain)


_decoded: dict[tuple[bytes, bytes | None], SeenRule] = {}
# Bounded like `_built`: the backstops of the sandboxes a worker cuts share their rules.
_DECODED_MAX = 1024


def _chain_rules(table: Any, name: str) -> tuple[SeenRule, ...]:
    """Each rule of chain `name`, decoded. python-iptables' decoding (a Rule object per
    entry, every option printed by its xtables extension through ctypes) was most of a
    status' cost, and every sandbox's backstop holds the same few rules: a rule is decoded
    once per worker and found again by its entry's bytes (counters left out) and the target
    name libiptc gives it, which are all the decoding reads (docs/netcut.md#latency)."""
    found = []
    entry = table.first_rule(name)
    while entry:
        key = (_entry_bytes(entry), table.get_target(entry))
        seen = _decoded.get(key)
        if seen is None:
            seen = _seen(table.create_rule(entry, iptc.Chain(table, name)))
            if len(_decoded) >= _DECODED_MAX:
                _decoded.clear()
            _decoded[key] = seen
        found.append(seen)
        entry = table.next_rule(entry)
    return tuple(found)


def _entry_bytes(entry: Any) -> bytes:
    """The entry as libiptc holds it, with its packet and byte counters and its kernel
    back pointer zeroed (they change as packets pass; the decoding never reads them)."""
    raw = bytearray(ctypes.string_at(ctypes.addressof(entry), entry.next_offset))
    kind = type(entry)
    for field in ("comefrom", "counters"):
        spot = getattr(kind, field)
        raw[spot.offset : spot.offset + spot.size] = bytes(spot.size)
    return bytes(raw)


def _seen(rule: Any) -> SeenRule:
    target = rule.target
    return SeenRule(
        target=target.name if target is not None else "",
        proto=rule.protocol,
        src=_unless_any(rule.src),
        dst=_unless_any(rule.dst),
        in_iface=rule.in_interface,
        out_iface=rule.out_interface,
        matches=tuple((m.name, _params(m)) for m in rule.matches),
        target_params=_params(target) if target is not None else (),
    )


def _unless_any(cidr: str | None) -> str | None:
    """None for 0.0.0.0/0.0.0.0 or ::/0 (python-iptables' "anywhere"), else as given."""
    if not cidr or cidr.split("/")[-1] in ("0", "0.0.0.0", "::"):
        return None
    return cidr


def _params(part: Any) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, " ".join(v)) for k, v in part.get_all_parameters().items()))


def _registered(names: str) -> list[str]:
    """The tables registered in this namespace (`ip{,6}_tables_names` in its /proc/net),
    read as bytes: Python's text layer doubled the cost of these small reads."""
    try:
        fd = os.open(f"{PROC_NET}/{names}", os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:  # no (IPv6) xtables in this kernel
        return []
    try:
        return os.read(fd, 4096).decode().split()
    finally:
        os.close(fd)


def prewarm() -> None:
    """Load the xtables extensions the backstop uses and build its fixed rules, without
    opening any table."""
    for family in (AF_INET, AF_INET6):
        for spec in backstop_rules(family, ()):
            cached_rule(family, spec)


# ---------------------------------------------------------------- redirects (nat)


def _nat_table() -> Any:
    iptc.Table._cache.pop(_NAT, None)
    iptc.Chain._cache.clear()
    return iptc.Table(_NAT, autocommit=False)


def build_nat_rule(spec: RedirectRule) -> Any:
    rule = iptc.Rule()
    if spec.dst:
        rule.dst = spec.dst
    if spec.dst_local:
        rule.create_match("addrtype").dst_type = "LOCAL"
    if spec.proto:
        rule.protocol = spec.proto
    if spec.dport is not None:
        rule.create_match(spec.proto or "tcp").dport = str(spec.dport)
    target = rule.create_target("REDIRECT" if spec.verdict == "redirect" else "RETURN")
    if spec.verdict == "redirect":
        target.to_ports = str(spec.to_port)
    return rule


class _NatJump(_OnlyTable, iptc.Rule):  # type: ignore[misc]
    pass


def _nat_jump(table: Any) -> Any:
    rule = _NatJump()
    rule.only = table
    rule.create_target(NAT_CHAIN)
    return rule


def install_nat(rules: tuple[RedirectRule, ...]) -> None:
    """Create (or refill) chain NETCUT_REDIRECT with `rules`, jumped to first from OUTPUT."""
    table = _nat_table()
    if table.is_chain(NAT_CHAIN):
        _delete_jumps_to(table, NAT_CHAIN)
        table.flush_entries(NAT_CHAIN)
    else:
        table.create_chain(NAT_CHAIN)
    chain = iptc.Chain(table, NAT_CHAIN)
    for spec in rules:
        chain.append_rule(build_nat_rule(spec))
    iptc.Chain(table, "OUTPUT").insert_rule(_nat_jump(table))
    table.commit()


def remove_nat() -> None:
    """Remove the jumps from OUTPUT and chain NETCUT_REDIRECT; nothing to do when absent."""
    if not nat_present():
        return
    table = _nat_table()
    _delete_jumps_to(table, NAT_CHAIN)
    table.flush_entries(NAT_CHAIN)
    table.delete_chain(NAT_CHAIN)
    table.commit()


def nat_present() -> bool:
    """Does this namespace's nat table hold chain NETCUT_REDIRECT? (Never registers it.)"""
    return _NAT in _registered("ip_tables_names") and bool(_nat_table().is_chain(NAT_CHAIN))


class Iptables:
    """`Netfilter` over python-iptables (legacy xtables, the backend helper mode's
    iptables-legacy also speaks, so either mode sees the other's rules)."""

    errors: tuple[type[Exception], ...] = (iptc.IPTCError,)

    def install_backstop(self, family: int, rules: tuple[OutputRule, ...]) -> None:
        install(family, rules)

    def remove_backstop(self, family: int) -> None:
        remove(family)

    def install_redirects(self, rules: tuple[RedirectRule, ...]) -> None:
        install_nat(rules)

    def remove_redirects(self) -> None:
        remove_nat()

    def read(self, verify: bool) -> tuple[tuple[int, ...], tuple[SeenBackstop, ...] | None, bool]:
        return read(verify)

    def prewarm(self) -> None:
        prewarm()

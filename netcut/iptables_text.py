"""iptables' rule language for netcut's backstop and redirects. Pure: data in, text out,
and text (or python-iptables' decoding) back in, in the plan's terms.

The plan (netcut/plan/) speaks of a backstop that every packet sent meets first and of
redirects; this module says how the iptables backend writes them: chain `NETCUT` in
the filter table (iptables and ip6tables) jumped to first from OUTPUT, and chain
`NETCUT_REDIRECT` in the nat table (IPv4), jumped to first from OUTPUT. Direct mode's
python-iptables driver (direct/iptables.py) and helper mode's shell face (iptables_shell.py,
for helper/script.py and helper/dump.py) both use it, so both modes write, read back and judge
the same rules (docs/netcut.md#backends).

Reading back is strict: a rule with anything netcut never writes decodes to None, which never
equals a planned rule, and only DROP or REJECT rules may sit ahead of the jump.
"""

from __future__ import annotations

import ipaddress
import shlex
from dataclasses import dataclass, replace
from typing import Literal

from netcut.errors import InvalidInput
from netcut.plan.model import AF_INET6, OutputRule, RedirectRule, SeenBackstop

# The chain that holds the backstop (filter table, iptables and ip6tables).
CHAIN = "NETCUT"
# The chain (nat table, IPv4 only) that holds transparent mode's redirects.
NAT_CHAIN = "NETCUT_REDIRECT"

# The plan's verdicts as iptables targets (REJECT-RST: REJECT --reject-with tcp-reset).
Verdict = Literal["allow", "reject", "reset"]
TARGETS: dict[Verdict, str] = {"allow": "ACCEPT", "reject": "REJECT", "reset": "REJECT-RST"}
_VERDICTS: dict[str, Verdict] = {v: k for k, v in TARGETS.items()}
# Targets that can only close more: harmless ahead of the jump to NETCUT.
_CLOSING = frozenset({"DROP", "REJECT"})
_ANY_PROTO = frozenset({"", "ip", "ipv6", "all", "0"})
_REJECT_DEFAULT = frozenset({"icmp-port-unreachable", "icmp6-port-unreachable"})


def tool_name(family: int) -> str:
    """The command that edits `family`'s tables, as messages name it."""
    return "ip6tables" if family == AF_INET6 else "iptables"


@dataclass(frozen=True)
class SeenRule:
    """One netfilter rule as read back from a table, in neutral form (what python-iptables
    decodes: `iptables -S` fields). `matches` and `target_params` hold every option, so a
    rule with anything netcut never writes cannot pass for one of its own."""

    target: str
    proto: str | None = None
    src: str | None = None
    dst: str | None = None
    in_iface: str | None = None
    out_iface: str | None = None
    matches: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()
    target_params: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        parts = [f"-p {self.proto}"] if self.proto else []
        flags = (("-s", self.src), ("-d", self.dst), ("-i", self.in_iface))
        for flag, value in (*flags, ("-o", self.out_iface)):
            if value:
                parts.append(f"{flag} {value}")
        for name, params in self.matches:
            parts.append(" ".join([f"-m {name}", *(f"--{k} {v}" for k, v in params)]))
        verdict = [f"-j {self.target}", *(f"--{k} {v}" for k, v in self.target_params)]
        parts.append(" ".join(verdict))
        return " ".join(parts)


# ---------------------------------------------------------------- writing


def filter_args(rule: OutputRule) -> list[str]:
    """A backstop rule as `iptables -A NETCUT` arguments."""
    args: list[str] = []
    if rule.out_iface:
        args += ["-o", rule.out_iface]
    if rule.dst_local:
        args += ["-m", "addrtype", "--dst-type", "LOCAL"]
    if rule.dst:
        args += ["-d", rule.dst]
    if rule.proto:
        args += ["-p", rule.proto]
    if rule.dport is not None:
        args += ["-m", rule.proto or "tcp", "--dport", str(rule.dport)]
    if rule.verdict == "reset":
        return [*args, "-j", "REJECT", "--reject-with", "tcp-reset"]
    return [*args, "-j", TARGETS[rule.verdict]]


def nat_args(rule: RedirectRule) -> list[str]:
    """A redirect as `iptables -t nat -A NETCUT_REDIRECT` arguments."""
    args: list[str] = []
    if rule.dst:
        args += ["-d", rule.dst]
    if rule.dst_local:
        args += ["-m", "addrtype", "--dst-type", "LOCAL"]
    if rule.proto:
        args += ["-p", rule.proto]
    if rule.dport is not None:
        args += ["-m", rule.proto or "tcp", "--dport", str(rule.dport)]
    if rule.verdict == "redirect":
        return [*args, "-j", "REDIRECT", "--to-ports", str(rule.to_port)]
    return [*args, "-j", "RETURN"]


# ---------------------------------------------------------------- reading back


def seen_backstop(
    family: int, output: tuple[SeenRule, ...], chain: tuple[SeenRule, ...] | None
) -> SeenBackstop:
    """OUTPUT's rules and chain NETCUT's (None: no chain) in the plan's terms: the jump
    must come first, behind nothing but DROP or REJECT rules."""
    ahead: list[str] = []
    first = False
    for rule in output:
        if _is_jump(rule, family):
            first = True
            break
        if rule.target not in _CLOSING:
            ahead.append(str(rule))
    if chain is None:
        return SeenBackstop(family, None, (), tuple(ahead), first)
    rules = tuple(as_output_rule(r, family) for r in chain)
    return SeenBackstop(family, rules, tuple(map(str, chain)), tuple(ahead), first)


def _is_jump(rule: SeenRule, family: int) -> bool:
    """`-j NETCUT` and nothing else (python-iptables shows "any" as 0.0.0.0/0.0.0.0)."""
    plain = SeenRule(rule.target, proto=rule.proto, src=rule.src, dst=rule.dst)
    anywhere = _cidr(rule.src, family) is None and _cidr(rule.dst, family) is None
    return rule.target == CHAIN and rule == plain and anywhere and (rule.proto or "") in _ANY_PROTO


def as_output_rule(rule: SeenRule, family: int) -> OutputRule | None:
    """The backstop rule `rule` is, or None when it holds anything netcut never writes."""
    verdict = _verdict(rule)
    proto = "" if (rule.proto or "") in _ANY_PROTO else rule.proto
    if verdict is None or proto not in ("", "tcp", "udp") or rule.in_iface:
        return None
    if _cidr(rule.src, family) is not None or (rule.out_iface or "").startswith("!"):
        return None
    dst = _cidr(rule.dst, family)
    if dst == "!":
        return None
    local = ("addrtype", (("dst-type", "LOCAL"),))
    dst_local = local in rule.matches  # transparent mode's narrower loopback
    if dst_local:
        rule = replace(rule, matches=tuple(m for m in rule.matches if m != local))
    dport = _dport(rule, proto)
    if dport == -1:
        return None
    return OutputRule(
        _VERDICTS[verdict],
        proto="tcp" if proto == "tcp" else "udp" if proto == "udp" else None,
        dst=dst,
        dport=dport,
        out_iface=rule.out_iface or None,
        dst_local=dst_local,
    )


def _verdict(rule: SeenRule) -> str | None:
    params = dict(rule.target_params)
    if rule.target == "ACCEPT" and not params:
        return "ACCEPT"
    if rule.target == "REJECT" and set(params) <= {"reject-with"}:
        with_ = params.get("reject-with", "icmp-port-unreachable")
        if with_ == "tcp-reset":
            return "REJECT-RST"
        if with_ in _REJECT_DEFAULT:
            return "REJECT"
    return None


def _dport(rule: SeenRule, proto: str | None) -> int | None:
    """The one `--dport N` match of `proto`; None without matches; -1 for anything else."""
    if not rule.matches:
        return None
    if len(rule.matches) != 1:
        return -1
    name, params = rule.matches[0]
    value = dict(params).get("dport", "")
    if name != proto or len(params) != 1 or not value.isdigit():
        return -1
    return int(value)


def _cidr(text: str | None, family: int) -> str | None:
    """`addr/mask` or `addr/len` as `addr/len`; None for "any"; "!" for a negation or an
    unreadable value (never equal to a planned rule)."""
    if not text:
        return None
    if text.startswith("!"):
        return "!"
    addr, _, mask = text.partition("/")
    try:
        ip = ipaddress.ip_address(addr)
        length: int
        if not mask:
            length = ip.max_prefixlen
        elif mask.isdigit():
            length = int(mask)
        else:
            length = bin(int(ipaddress.ip_address(mask))).count("1")
    except ValueError:
        return "!"
    if length == 0:
        return None
    return f"{ip}/{length}"


# ---------------------------------------------------------------- `iptables -S` text


# `iptables -S` options and the SeenRule fields they fill (python-iptables' names).
_RULE_FIELDS = {"-p": "proto", "-s": "src", "-d": "dst", "-i": "in_iface", "-o": "out_iface"}


def rule_specs(text: str, chain: str) -> tuple[SeenRule, ...]:
    """`iptables -S CHAIN` lines (`-A CHAIN ...`) as SeenRules, in order; the policy line
    (`-P`) and the chain's own (`-N`) are skipped."""
    return tuple(
        parse_rule_spec(line) for line in text.splitlines() if line.startswith(f"-A {chain} ")
    )


def parse_rule_spec(line: str) -> SeenRule:
    """One `-A CHAIN ...` line as the SeenRule python-iptables would decode for it (direct
    mode's `backstop.dump`), so plan/verify.py compares both modes' dumps the same way. A negated
    option (`! -d X`, `! --dport N`) keeps its `!`, which never equals a planned rule."""
    try:
        words = shlex.split(line)[2:]
    except ValueError:
        raise InvalidInput(f"helper state dump: unreadable rule {line!r}") from None
    fields: dict[str, str] = {}
    matches: list[tuple[str, list[tuple[str, str]]]] = []
    target, params = "", list[tuple[str, str]]()
    i, negate, in_target = 0, "", False
    while i < len(words):
        word = words[i]
        if word == "!":
            negate, i = "!", i + 1
            continue
        value = words[i + 1] if i + 1 < len(words) else ""
        if word in _RULE_FIELDS and not in_target and not matches:
            fields[_RULE_FIELDS[word]] = negate + value
        elif word == "-m":
            matches.append((value, []))
        elif word == "-j":
            target, in_target = value, True
        elif word.startswith("--"):
            (params if in_target else matches[-1][1] if matches else params).append(
                (word[2:], negate + value)
            )
        else:
            raise InvalidInput(f"helper state dump: unreadable rule {line!r}")
        negate, i = "", i + 2
    return SeenRule(
        target=target,
        proto=fields.get("proto", "ip"),  # python-iptables' "any protocol"
        src=_masked(fields.get("src")),
        dst=_masked(fields.get("dst")),
        in_iface=fields.get("in_iface"),
        out_iface=fields.get("out_iface"),
        matches=tuple((name, tuple(sorted(opts))) for name, opts in matches),
        target_params=tuple(sorted(params)),
    )


def _masked(cidr: str | None) -> str | None:
    """`addr/len` as python-iptables shows it, `addr/netmask`; anything else unchanged."""
    if cidr is None or cidr.startswith("!"):
        return cidr
    try:
        net = ipaddress.ip_network(cidr, strict=False)
    except ValueError:
        return cidr
    return f"{cidr.partition('/')[0]}/{net.netmask}"


# First line of a dump section that holds `iptables-save` output (IptablesShell.dump).
SAVE_MARK = "netcut-save"
# A table's chains (built-in and user-defined) -> their `-A CHAIN ...` lines, in order.
SavedTable = dict[str, list[str]]
_MAX_SAVE_LINES = 200_000


def parse_save(text: str) -> dict[str, SavedTable]:
    """`iptables-save` output as table -> chain -> rule lines. Strict, as the kernel's own
    tool writes it: `*TABLE`, then `:CHAIN POLICY [p:b]` lines, `-A CHAIN ...` lines for
    chains declared above, `COMMIT`; `#` comments and blank lines skipped. Anything else (a
    rule outside a table or for an undeclared chain, a table twice, one never committed)
    is InvalidInput: a dump that cannot be read never passes for one without the backstop."""
    tables: dict[str, SavedTable] = {}
    current: SavedTable | None = None
    for n, line in enumerate(text.splitlines()):
        if n > _MAX_SAVE_LINES:
            raise InvalidInput("helper state dump: iptables-save output too long")
        if not line.strip() or line.startswith("#"):
            continue
        if line.startswith("*") and current is None:
            name = line[1:].strip()
            if not name or name in tables or any(c.isspace() for c in name):
                raise InvalidInput(f"helper state dump: bad iptables-save table {line[:200]!r}")
            current = tables[name] = {}
        elif current is not None and line.startswith(":"):
            chain = line[1:].split(" ", 1)[0]
            if not chain or chain in current:
                raise InvalidInput(f"helper state dump: bad iptables-save chain {line[:200]!r}")
            current[chain] = []
        elif current is not None and line.startswith("-A "):
            chain = line[3:].split(" ", 1)[0]
            if chain not in current:
                raise InvalidInput(f"helper state dump: rule for no chain {line[:200]!r}")
            current[chain].append(line)
        elif current is not None and line.strip() == "COMMIT":
            current = None
        else:
            raise InvalidInput(f"helper state dump: unreadable iptables-save line {line[:200]!r}")
    if current is not None:
        raise InvalidInput("helper state dump: iptables-save output cut short (no COMMIT)")
    return tables

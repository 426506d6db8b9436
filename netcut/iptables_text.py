"""iptables' rule language for netcut's backstop and redirects. Pure: data in, text out,
and text (or python-iptables' decoding) back in, in the plan's terms.

The plan (netcut/plan/) speaks of a backstop that every packet sent meets first and of
redirects; this module says how the iptables backend writes them: chain `NETCUT` in
the filter table (iptables and ip6tables) jumped to first from OUTPUT, and chain
`NETCUT_REDIRECT` in the nat table (IPv4), jumped to first from OUTPUT. Direct mode's
python-iptables driver (direct/iptables.py) and helper mode's shell scripts (helper/script.py,
helper/dump.py) both use it, so both modes write, read back and judge the same rules
(docs/netcut.md#backends).

Reading back is strict: a rule with anything netcut never writes decodes to None, which never
equals a planned rule, and only DROP or REJECT rules may sit ahead of the jump.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

from netcut.errors import InvalidInput
from netcut.plan.model import AF_INET, AF_INET6, OutputRule, RedirectRule, SeenBackstop

# A state-dump section: its name, the command it stands for (for error messages), the shell
# that prints it (helper/script.py's format, which helper/dump.py reads back).
Section = Callable[[str, str, str], str]

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


# ---------------------------------------------------------------- helper mode's shell face

# The temporary rule that holds OUTPUT closed while chain NETCUT is (re)built.
_HOLD = ["-m", "comment", "--comment", "netcut-hold", "-j", "REJECT"]
_TOLERANT = " 2>/dev/null || true"
# The hold rule as `-save` prints it, and as a restore line's words.
_HOLD_TEXT = "-m comment --comment netcut-hold -j REJECT"
_HOLD_SAVED = "-A OUTPUT " + _HOLD_TEXT


def _q(args: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in args)


def _sh(family: int) -> str:
    return "ncut_ip6tables" if family == AF_INET6 else "ncut_iptables"


def _read_lines(names: str, table: str) -> str:
    """Set t=yes if /proc/net/NAMES lists `table`. A last line without a newline still
    counts (`read` returns 1 for it but fills the variable)."""
    return (
        f'while read -r n || [ -n "$n" ]; do [ "$n" = {table} ] && t=yes; n=;'
        f" done < /proc/net/{names} 2>/dev/null"
    )


# What `iptables-restore` reads as one word with no quoting at all (its own quoting is not
# the shell's); any other word keeps an op on the per-command path.
_RESTORE_WORD = re.compile(r"[A-Za-z0-9_.:/+@%=,-]+")


def _restore_args(args: list[str]) -> str:
    """`args` as one restore line's words, or a line ending in NUL when one cannot be."""
    if not all(_RESTORE_WORD.fullmatch(a) for a in args):
        return "\0"
    return " ".join(args)


def _batched(family: int, fill: tuple[str, ...] | None, by_command: list[str]) -> str:
    """Shell that changes `family`'s filter table in one `-restore --noflush` commit, which
    the kernel takes at once (so no hold rule: the namespace is never open between two
    commands). One `-save -t filter` first tells how many jumps to NETCUT (and leftover hold
    rules) OUTPUT has and whether the chain is there; the commit deletes them all, then with
    `fill` creates or empties the chain (`:NETCUT` under `--noflush`), refills it and jumps
    to it first, without `fill` flushes and deletes the chain. An image without both tools
    runs `by_command`, as before (docs/netcut.md#helper-mode)."""
    six = "6" if family == AF_INET6 else ""
    save, restore = f"ncut_ip{six}tsave", f"ncut_ip{six}trestore"
    reject = "icmp6-port-unreachable" if six else "icmp-port-unreachable"
    known = {
        f"-A OUTPUT -j {CHAIN}": f"-D OUTPUT -j {CHAIN}",
        f"{_HOLD_SAVED} --reject-with {reject}": f"-D OUTPUT {_HOLD_TEXT}",
    }
    cases = " ".join(
        f'{shlex.quote(seen)}) set -- "$@" {shlex.quote(delete)};;'
        for seen, delete in known.items()
    )
    if fill is None:
        drop = f"{shlex.quote('-F ' + CHAIN)} {shlex.quote('-X ' + CHAIN)}"
        chain = f'if [ $ncut_c = yes ]; then set -- "$@" {drop}; fi'
    else:
        chain = f'set -- "$@" {" ".join(shlex.quote(x) for x in (f":{CHAIN} - [0:0]", *fill))}'
    return (
        f'if [ -x "$NCUT_IP{six}TSAVE" ] && [ -x "$NCUT_IP{six}TRESTORE" ]; then\n'
        f"if ncut_s=$({save} -t filter); then ncut_c=no; set -- '*filter'\n"
        f'while IFS= read -r l || [ -n "$l" ]; do case "$l" in {cases}'
        f' ":{CHAIN} "*) ncut_c=yes;; esac; l=; done <<NCUT_EOF\n$ncut_s\nNCUT_EOF\n'
        f'{chain}; printf "%s\\n" "$@" COMMIT | {restore} -w --noflush\n'
        f"else false; fi\nelse\n" + "\n".join(by_command) + "\nfi"
    )


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


def _read_saves(
    sections: dict[str, str], verify: bool
) -> tuple[tuple[int, ...], tuple[SeenBackstop, ...] | None, bool]:
    """`read_dump` from one `iptables-save` per family: the families whose filter table has
    chain NETCUT, with `verify` each one's backstop (OUTPUT's and NETCUT's rules, read as
    `-S` lines: save writes rules the same way), and whether the nat table has the
    redirect chain."""
    saved = {
        f: parse_save(sections[name].removeprefix(SAVE_MARK))
        for f, name in ((AF_INET, "backstop4"), (AF_INET6, "backstop6"))
    }
    filters = {f: tables.get("filter", {}) for f, tables in saved.items()}
    families = tuple(f for f in (AF_INET, AF_INET6) if CHAIN in filters[f])
    seen = None
    if verify:
        seen = tuple(
            seen_backstop(
                f,
                rule_specs("\n".join(filters[f].get("OUTPUT", ())), "OUTPUT"),
                rule_specs("\n".join(filters[f][CHAIN]), CHAIN),
            )
            for f in families
        )
    return families, seen, NAT_CHAIN in saved[AF_INET].get("nat", {})


def _yes(sections: dict[str, str], name: str) -> bool:
    answer = sections[name].strip()
    if answer not in ("yes", "no"):
        raise InvalidInput(f"helper state dump: {name!r} answered {answer[:200]!r}")
    return answer == "yes"


class IptablesShell:
    """`ShellNetfilter` (netfilter.py) with iptables-legacy and ip6tables-legacy, the backend
    python-iptables drives in direct mode, so either mode sees the other's rules."""

    def __init__(self) -> None:
        self.tools = {
            "iptables": "iptables-legacy",
            "ip6tables": "ip6tables-legacy",
            "iptsave": "iptables-legacy-save",
            "ip6tsave": "ip6tables-legacy-save",
            "iptrestore": "iptables-legacy-restore",
            "ip6trestore": "ip6tables-legacy-restore",
        }
        self.sections: tuple[str, ...] = ("backstop4", "backstop6")
        # python-iptables in netcut's worker: a commit per change, no process per command
        self.native: str | None = "netcut.direct.iptables:Iptables"

    def install_backstop(self, family: int, rules: tuple[OutputRule, ...]) -> list[str]:
        # Like direct/iptables.install: (re)fill the chain, one jump first in OUTPUT. A chain
        # that exists (a repair) is rebuilt behind a temporary REJECT, so the namespace never
        # opens while it is empty.
        t = _sh(family)
        return [
            _q([t, "-w", "-I", "OUTPUT", "1", *_HOLD]),
            f"while {_q([t, '-w', '-D', 'OUTPUT', '-j', CHAIN])} 2>/dev/null; do :; done",
            f"{_q([t, '-w', '-N', CHAIN])} 2>/dev/null || {_q([t, '-w', '-F', CHAIN])}",
            *(_q([t, "-w", "-A", CHAIN, *filter_args(rule)]) for rule in rules),
            _q([t, "-w", "-I", "OUTPUT", "1", "-j", CHAIN]),
            _q([t, "-w", "-D", "OUTPUT", *_HOLD]),
        ]

    def batched_backstop(self, family: int, rules: tuple[OutputRule, ...] | None) -> str | None:
        """`install_backstop(family, rules)` (`remove_backstop` when `rules` is None) as one
        `-save` and one `-restore --noflush` when the image has both (the default image
        does: helper/image.py), the shell telling which (`_batched`): nothing is assumed of
        a user's image, which keeps the per-command path. None when a rule has a word that
        restore's own quoting cannot carry."""
        if rules is None:
            return _batched(family, None, self.remove_backstop(family))
        lines = [f"-A {CHAIN} {_restore_args(filter_args(rule))}" for rule in rules]
        if any(line.endswith("\0") for line in lines):
            return None
        fill = (*lines, f"-I OUTPUT 1 -j {CHAIN}")
        return _batched(family, fill, self.install_backstop(family, rules))

    def remove_backstop(self, family: int) -> list[str]:
        t = _sh(family)
        return [
            f"while {_q([t, '-w', '-D', 'OUTPUT', '-j', CHAIN])} 2>/dev/null; do :; done",
            f"while {_q([t, '-w', '-D', 'OUTPUT', *_HOLD])} 2>/dev/null; do :; done",
            _q([t, "-w", "-F", CHAIN]) + _TOLERANT,
            _q([t, "-w", "-X", CHAIN]) + _TOLERANT,
        ]

    def install_redirects(self, rules: tuple[RedirectRule, ...]) -> list[str]:
        t = _sh(AF_INET)  # transparent mode: IPv4 nat table
        return [
            _q([t, "-w", "-t", "nat", "-N", NAT_CHAIN]),
            *(_q([t, "-w", "-t", "nat", "-A", NAT_CHAIN, *nat_args(r)]) for r in rules),
            _q([t, "-w", "-t", "nat", "-I", "OUTPUT", "1", "-j", NAT_CHAIN]),
        ]

    def remove_redirects(self) -> list[str]:
        t = _sh(AF_INET)
        return [
            f"while {_q([t, '-w', '-t', 'nat', '-D', 'OUTPUT', '-j', NAT_CHAIN])} 2>/dev/null;"
            " do :; done",
            _q([t, "-w", "-t", "nat", "-F", NAT_CHAIN]) + _TOLERANT,
            _q([t, "-w", "-t", "nat", "-X", NAT_CHAIN]) + _TOLERANT,
        ]

    def dump(self, section: Section, verify: bool) -> list[str]:
        """One `iptables-legacy-save` per family when the image has it (the default image
        does: helper/image.py): every registered table in one run, which `read_dump` reads
        for the chain, its rules and the redirects whether or not `verify` asks for the
        rules (`save` lists only registered tables, so it registers none). An image without
        it gets `_dump_by_command`: today's several `-S` runs per family."""
        saves = [
            section(
                name,
                f"{tool_name(family)}-legacy-save (if /proc/net/{names} exists)",
                f"echo {SAVE_MARK}; if [ -e /proc/net/{names} ]; then {sh}; fi",
            )
            for family, name, names, sh in (
                (AF_INET, "backstop4", "ip_tables_names", "ncut_iptsave"),
                (AF_INET6, "backstop6", "ip6_tables_names", "ncut_ip6tsave"),
            )
        ]
        fallback = "\n".join(self._dump_by_command(section, verify))
        return [
            'if [ -x "$NCUT_IPTSAVE" ] && [ -x "$NCUT_IP6TSAVE" ]; then',
            *saves,
            "else",
            fallback,
            "fi",
        ]

    def _dump_by_command(self, section: Section, verify: bool) -> list[str]:
        """Per family: is chain NETCUT there, and with `verify` OUTPUT's and NETCUT's rules
        (`iptables -S`); then the redirect chain. A table is looked at only if it is
        registered: listing it would register it."""
        lines = []
        tables = (
            (AF_INET, "backstop4", "ip_tables_names"),
            (AF_INET6, "backstop6", "ip6_tables_names"),
        )
        for family, name, names in tables:
            tool, sh = tool_name(family), _sh(family)
            lines.append(
                section(
                    name,
                    f"{tool}-legacy -w -S {CHAIN} (if /proc/net/{names} lists filter)",
                    f"t=no; {_read_lines(names, 'filter')}; r=0;"
                    f" if [ $t = yes ]; then out=$({sh} -w -S {CHAIN} 2>&1); r=$?;"
                    ' if [ $r = 0 ]; then echo yes; r=0; else case "$out" in'
                    ' *"No chain"*|*"does not exist"*) echo no; r=0;; *) echo "$out";; esac; fi;'
                    " else echo no; fi; (exit $r)",
                )
            )
            if verify:
                v, shown = name[-1], f"{tool}-legacy"
                lines.append(
                    f"if [ $t = yes ] && [ $r = 0 ] && {sh} -w -S {CHAIN} >/dev/null 2>&1; then"
                    f" {section(f'output{v}', f'{shown} -w -S OUTPUT', f'{sh} -w -S OUTPUT')};"
                    f" {section(f'chain{v}', f'{shown} -w -S {CHAIN}', f'{sh} -w -S {CHAIN}')};"
                    " fi"
                )
        lines.append(
            "echo '### redirect'; t=no; " + _read_lines("ip_tables_names", "nat") + ";"
            f" if [ $t = yes ] && {_sh(AF_INET)} -w -t nat -S {NAT_CHAIN} >/dev/null 2>&1;"
            " then echo yes; else echo no; fi; echo '### rc 0'"
        )
        return lines

    def read_dump(
        self, sections: dict[str, str], verify: bool
    ) -> tuple[tuple[int, ...], tuple[SeenBackstop, ...] | None, bool]:
        if all(sections[n].startswith(SAVE_MARK) for n in ("backstop4", "backstop6")):
            return _read_saves(sections, verify)
        families = tuple(
            f
            for f, name in ((AF_INET, "backstop4"), (AF_INET6, "backstop6"))
            if _yes(sections, name)
        )
        seen = None
        if verify:
            seen = tuple(
                seen_backstop(
                    f,
                    rule_specs(sections[f"output{v}"], "OUTPUT"),
                    rule_specs(sections[f"chain{v}"], CHAIN),
                )
                for f, v in ((AF_INET, "4"), (AF_INET6, "6"))
                if f in families and f"output{v}" in sections
            )
        return families, seen, sections.get("redirect", "").strip() == "yes"

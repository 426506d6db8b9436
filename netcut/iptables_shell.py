"""The iptables backend's shell face (helper mode): netcut's backstop and redirects as shell
commands for iptables-legacy, and the state dump they print read back in the plan's terms.
Pure: data in, text out (docs/netcut.md#backends).

`IptablesShell` is `ShellNetfilter` (netfilter.py) with iptables-legacy and ip6tables-legacy,
the backend python-iptables drives in direct mode, so either mode sees the other's rules; the
rule language both modes share (chains, a rule as arguments, `iptables -S` and
`iptables-save` text) is iptables_text.py's. A chain that exists is rebuilt behind a
temporary REJECT, or in one `-restore --noflush` commit when the image has both tools, so
the namespace never opens while it is empty.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable

from netcut.errors import InvalidInput
from netcut.iptables_text import (
    CHAIN,
    NAT_CHAIN,
    SAVE_MARK,
    filter_args,
    nat_args,
    parse_save,
    rule_specs,
    seen_backstop,
    tool_name,
)
from netcut.plan.model import AF_INET, AF_INET6, OutputRule, RedirectRule, SeenBackstop

# A state-dump section: its name, the command it stands for (for error messages), the shell
# that prints it (helper/script.py's format, which helper/dump.py reads back).
Section = Callable[[str, str, str], str]

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
    # a removal takes the table as `has_backstop` just saved it, if it did (a restore's
    # check: nothing but this op changes the filter table after it); a save otherwise
    saved, forget = f"$({save} -t filter)", ""
    if fill is None:
        saved, forget = f"${{ncut_saved{six or 4}-{saved}}}", f"unset ncut_saved{six or 4}; "
        drop = f"{shlex.quote('-F ' + CHAIN)} {shlex.quote('-X ' + CHAIN)}"
        chain = f'if [ $ncut_c = yes ]; then set -- "$@" {drop}; fi'
    else:
        chain = f'set -- "$@" {" ".join(shlex.quote(x) for x in (f":{CHAIN} - [0:0]", *fill))}'
    return (
        f'if [ -x "$NCUT_IP{six}TSAVE" ] && [ -x "$NCUT_IP{six}TRESTORE" ]; then\n'
        f"if ncut_s={saved}; then {forget}ncut_c=no; set -- '*filter'\n"
        f'while IFS= read -r l || [ -n "$l" ]; do case "$l" in {cases}'
        f' ":{CHAIN} "*) ncut_c=yes;; esac; l=; done <<NCUT_EOF\n$ncut_s\nNCUT_EOF\n'
        f'{chain}; printf "%s\\n" "$@" COMMIT | {restore} -w --noflush\n'
        f"else false; fi\nelse\n" + "\n".join(by_command) + "\nfi"
    )


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

    def has_backstop(self, family: int) -> str:
        """With `-save` where the image has it: one run of it is about a third of
        `iptables -S`'s (measured in the helper: 1.8 ms, 4.7 ms). The table it saved is kept
        in `ncut_savedN` for the backstop's removal (`_batched`), which then saves nothing."""
        six = "6" if family == AF_INET6 else ""
        names, kept = f"ip{six}_tables_names", f"ncut_saved{six or 4}"
        return (
            f"{{ t=no; {_read_lines(names, 'filter')}; [ $t = yes ] &&"
            f' if [ -x "$NCUT_IP{six}TSAVE" ]; then {kept}=$(ncut_ip{six}tsave -t filter)'
            f' && case "${kept}" in'
            f' *":{CHAIN} - ["*) true;; *) false;; esac;'
            f" else {_sh(family)} -w -S {CHAIN} >/dev/null 2>&1; fi; }}"
        )

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


__all__ = ["IptablesShell", "Section"]

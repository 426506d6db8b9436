"""Plan ops as shell commands for the helper container, and the helper's state dump parsed
back into a NamespaceState. Pure: text in, text or data out.

The helper image carries iproute2 (`ip`, `ss`) and iptables' legacy backend (the same one
python-iptables drives in direct mode, so either mode sees the other's backstop). A cut script
runs under `set -e` and stops at the first failure; the caller then runs the rollback script,
whose commands, like restore's, tolerate what is already undone.

No busybox is assumed (docs/netcut.md#helper-mode): `PRELUDE` finds every tool by absolute
path, skipping busybox applets (Debian's busybox ash runs its own `ip` applet ahead of PATH,
and that applet has no `-j`), and the scripts call them through `ncut_*` functions, whose names
no shell has a builtin or applet for. Every state dump proves itself: each tool's exit status is
printed after its output, and `parse_state_dump` refuses a dump with a failed tool, without the
loopback interface, or with output that does not parse, so a broken helper can never make an
empty namespace look cut.
"""

from __future__ import annotations

import ipaddress
import json
import shlex
from typing import Any

from netcut.errors import InvalidInput
from netcut.model import (
    AF_INET,
    AF_INET6,
    CHAIN,
    FR_ACT_TO_TBL,
    NAT_CHAIN,
    RT_TABLE_LOCAL,
    RTN_LOCAL,
    RTN_UNICAST,
    RTNH_F_ONLINK,
    AddAddr,
    AddBackstop,
    Addr,
    AddRedirect,
    AddRoute,
    DelAddr,
    DelRoute,
    FilterDump,
    Keep,
    KillFlows,
    Link,
    Lookup,
    NamespaceState,
    Op,
    PolicyRule,
    ProbeItem,
    ProbeResult,
    RemoveBackstop,
    RemoveRedirect,
    Route,
    SeenRule,
    SetSysctl,
)

_PREFS = {"medium": 0, "high": 1, "low": 3}
# The temporary rule that holds OUTPUT closed while chain NETCUT is (re)built.
_HOLD = ["-m", "comment", "--comment", "netcut-hold", "-j", "REJECT"]
_TOLERANT = " 2>/dev/null || true"


# Where the helper looks for its tools, in order: the default image's own directory first
# (helperimage.py), then the usual places of a user-supplied image.
TOOL_DIRS = ("/netcut/bin", "/usr/sbin", "/sbin", "/usr/bin", "/bin")
_TOOLS = {
    "ip": "ip",
    "ss": "ss",
    "iptables": "iptables-legacy",
    "ip6tables": "ip6tables-legacy",
    "timeout": "timeout",
    "nc": "nc",
}
PRELUDE = (
    "exec 2>&1\n"
    # ncut_find VAR TOOL: VAR=the first executable TOOL in TOOL_DIRS that is not a busybox
    # applet (no subshell, no fork for the default image's own /netcut/bin).
    "ncut_find() { for d in " + " ".join(TOOL_DIRS) + "; do f=$d/$2; [ -x \"$f\" ] || continue;"
    ' if [ "$d" != /netcut/bin ] && [ -L "$f" ]; then'
    ' case "$(readlink "$f" 2>/dev/null)" in *busybox*) continue;; esac; fi;'
    ' eval "$1=\\$f"; return 0; done; eval "$1=/missing/$2"; }\n'
    + "".join(
        f'ncut_find NCUT_{n.upper()} {tool}; ncut_{n}() {{ "$NCUT_{n.upper()}" "$@"; }}\n'
        for n, tool in _TOOLS.items()
    )
)


def _tool(family: int) -> str:
    return "ncut_ip6tables" if family == AF_INET6 else "ncut_iptables"


def _q(args: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in args)


def _fam(family: int) -> str:
    return "-6" if family == AF_INET6 else "-4"


def render_op(op: Op) -> list[str]:
    """Shell commands equivalent to `op` (apply.py's dispatcher, in iproute2/iptables)."""
    if isinstance(op, AddBackstop):
        # Like backstop.install: (re)fill the chain, one jump first in OUTPUT. A chain that
        # exists (a repair) is rebuilt behind a temporary REJECT, so the namespace never
        # opens while it is empty.
        t = _tool(op.family)
        return [
            _q([t, "-w", "-I", "OUTPUT", "1", *_HOLD]),
            f"while {_q([t, '-w', '-D', 'OUTPUT', '-j', CHAIN])} 2>/dev/null; do :; done",
            f"{_q([t, '-w', '-N', CHAIN])} 2>/dev/null || {_q([t, '-w', '-F', CHAIN])}",
            *(_q([t, "-w", "-A", CHAIN, *rule.iptables_args()]) for rule in op.rules),
            _q([t, "-w", "-I", "OUTPUT", "1", "-j", CHAIN]),
            _q([t, "-w", "-D", "OUTPUT", *_HOLD]),
        ]
    if isinstance(op, RemoveBackstop):
        t = _tool(op.family)
        return [
            f"while {_q([t, '-w', '-D', 'OUTPUT', '-j', CHAIN])} 2>/dev/null; do :; done",
            f"while {_q([t, '-w', '-D', 'OUTPUT', *_HOLD])} 2>/dev/null; do :; done",
            _q([t, "-w", "-F", CHAIN]) + _TOLERANT,
            _q([t, "-w", "-X", CHAIN]) + _TOLERANT,
        ]
    if isinstance(op, AddRedirect):  # transparent mode: IPv4 nat table
        t = _tool(AF_INET)
        return [
            _q([t, "-w", "-t", "nat", "-N", NAT_CHAIN]),
            *(_q([t, "-w", "-t", "nat", "-A", NAT_CHAIN, *r.iptables_args()]) for r in op.rules),
            _q([t, "-w", "-t", "nat", "-I", "OUTPUT", "1", "-j", NAT_CHAIN]),
        ]
    if isinstance(op, RemoveRedirect):
        t = _tool(AF_INET)
        return [
            f"while {_q([t, '-w', '-t', 'nat', '-D', 'OUTPUT', '-j', NAT_CHAIN])} 2>/dev/null;"
            " do :; done",
            _q([t, "-w", "-t", "nat", "-F", NAT_CHAIN]) + _TOLERANT,
            _q([t, "-w", "-t", "nat", "-X", NAT_CHAIN]) + _TOLERANT,
        ]
    if isinstance(op, AddRoute | DelRoute):
        verb = "add" if isinstance(op, AddRoute) else "del"
        return [_q(["ncut_ip", _fam(op.route.family), "route", verb, *op.route.ip_args()])]
    if isinstance(op, AddAddr | DelAddr):
        a = op.addr
        args = [
            "ncut_ip",
            _fam(a.family),
            "addr",
            "add" if isinstance(op, AddAddr) else "del",
            f"{a.address}/{a.prefixlen}",
            "dev",
            a.ifname,
        ]
        return [_q(args + (["nodad"] if isinstance(op, AddAddr) and a.family == AF_INET6 else []))]
    if isinstance(op, SetSysctl):
        return [f"echo {shlex.quote(op.value)} > {shlex.quote('/proc/sys/' + op.key)}"]
    if isinstance(op, KillFlows):
        return [_kill_flows(op)]
    raise RuntimeError(f"unexpected {op!r}")


def _kill_flows(op: KillFlows) -> str:
    terms = ["dst 127.0.0.0/8", "dst [::1]"]
    for addr, port in op.allowed:
        host = f"[{addr}]" if ":" in addr else addr
        terms.append(f"dst {host}" if port is None else f"dst {host}:{port}")
    expr = "not ( " + " or ".join(terms) + " )"
    return f"ncut_ss -K -t state connected {shlex.quote(expr)} >/dev/null" + _TOLERANT


def render_script(ops: tuple[Op, ...], *, tolerant: bool = False) -> str:
    """A /bin/sh script for `ops`: strict (`set -e`) for a cut, tolerant for undo."""
    lines = [line for op in ops for line in render_op(op)]
    if tolerant:
        lines = [line if line.endswith(_TOLERANT) else line + _TOLERANT for line in lines]
        return "\n".join(lines) + "\n"
    return "set -e\n" + "\n".join(lines) + "\n"


# ---------------------------------------------------------------- state dump


def state_script(keeps: tuple[Keep, ...], verify: bool = False) -> str:
    """A script whose output `parse_state_dump` reads: JSON from `ip`, sysctls, chain marks;
    with `verify` also the policy rules and, where the chain exists, OUTPUT's and NETCUT's
    rules (`iptables -S`), which status compares with the plan (docs/netcut.md#status).

    Each section is followed by `### rc N`, the exit status of the command that produced it."""
    lines = [
        "echo '### links'; ncut_ip -j link show; echo \"### rc $?\"",
        "echo '### addrs'; ncut_ip -j -N addr show; echo \"### rc $?\"",
        "echo '### routes4'; ncut_ip -d -N -j -4 route show table all; echo \"### rc $?\"",
        "echo '### routes6'; if [ -d /proc/sys/net/ipv6 ]; then"
        " ncut_ip -d -N -j -6 route show table all; else echo '[]'; fi; echo \"### rc $?\"",
    ]
    for keep in keeps:
        if not keep.is_loopback:
            # No route at all is an answer (an error exit), not a broken tool.
            addr = shlex.quote(str(keep.addr))
            lines.append(
                f"echo '### get {keep.addr}'; ncut_ip -d -N -j route get {addr} 2>/dev/null"
                " || echo '[]'; echo '### rc 0'"
            )
    lines.append(
        "echo '### sysctls'; r=0; for f in /proc/sys/net/ipv6/conf/*/disable_ipv6"
        ' /proc/sys/net/ipv6/conf/*/accept_ra; do [ -e "$f" ] || continue;'
        ' read -r v < "$f" || r=1; echo "$f $v"; done; echo "### rc $r"'
    )
    for family, name, names in ((AF_INET, "backstop4", "ip_tables_names"),
                                (AF_INET6, "backstop6", "ip6_tables_names")):  # fmt: skip
        # Look at the table only if it is registered: listing it would register it.
        lines.append(
            f"echo '### {name}'; t=no; while read -r n; do [ \"$n\" = filter ] && t=yes;"
            f" done < /proc/net/{names} 2>/dev/null; r=0;"
            f" if [ $t = yes ]; then out=$({_tool(family)} -w -S {CHAIN} 2>&1); r=$?;"
            ' if [ $r = 0 ]; then echo yes; r=0; else case "$out" in'
            ' *"No chain"*|*"does not exist"*) echo no; r=0;; *) echo "$out";; esac; fi;'
            ' else echo no; fi; echo "### rc $r"'
        )
        if verify:
            tool, v = _tool(family), name[-1]
            lines.append(
                f"if [ $t = yes ] && [ $r = 0 ] && {tool} -w -S {CHAIN} >/dev/null 2>&1; then"
                f" echo '### output{v}'; {tool} -w -S OUTPUT; echo \"### rc $?\";"
                f" echo '### chain{v}'; {tool} -w -S {CHAIN}; echo \"### rc $?\"; fi"
            )
    if verify:
        lines.append("echo '### rules4'; ncut_ip -j -N -4 rule show; echo \"### rc $?\"")
        lines.append(
            "echo '### rules6'; if [ -d /proc/sys/net/ipv6 ]; then"
            " ncut_ip -j -N -6 rule show; else echo '[]'; fi; echo \"### rc $?\""
        )
    # transparent mode's redirect chain (nat), looked at only if the nat table is registered
    lines.append(
        "echo '### redirect'; t=no; while read -r n; do [ \"$n\" = nat ] && t=yes;"
        " done < /proc/net/ip_tables_names 2>/dev/null;"
        f" if [ $t = yes ] && {_tool(AF_INET)} -w -t nat -S {NAT_CHAIN} >/dev/null 2>&1;"
        " then echo yes; else echo no; fi; echo '### rc 0'"
    )
    return "\n".join(lines) + "\n"


def probe_script(reachable: tuple[Keep, ...], blocked: tuple[Keep, ...], timeout: float) -> str:
    """Connect to every target at once; one `connected T` or `failed T` line each.

    bash's /dev/tcp under `timeout` when the helper shell is bash (the default image), else
    `nc -z -w` (an Alpine-style image); both bounded by `timeout` seconds."""
    secs = str(max(1, round(timeout)))
    lines = [
        'ncut_probe() { if [ -n "$BASH_VERSION" ] && [ -x "$NCUT_TIMEOUT" ]; then'
        ' ncut_timeout "$3" "$BASH" -c \'exec 3<>"/dev/tcp/$0/$1"\' "$1" "$2";'
        ' else ncut_nc -z -w "$3" "$1" "$2"; fi </dev/null >/dev/null 2>&1'
        ' && echo "connected $4" || echo "failed $4"; }'
    ]
    for keep in (*reachable, *blocked):
        args = _q([str(keep.addr), str(keep.port), secs, str(keep)])
        lines.append(f"ncut_probe {args} &")
    lines.append("wait")
    return "\n".join(lines) + "\n"


def parse_probe(text: str, reachable: tuple[Keep, ...], blocked: tuple[Keep, ...]) -> ProbeResult:
    """Read `probe_script` output: one `connected TARGET` or `failed TARGET` line each."""
    outcomes: dict[str, str] = {}
    for line in text.splitlines():
        outcome, _, name = line.partition(" ")
        outcomes[name.strip()] = outcome
    items = [ProbeItem(str(k), "reachable", outcomes.get(str(k), "no answer")) for k in reachable]
    items += [ProbeItem(str(k), "blocked", outcomes.get(str(k), "no answer")) for k in blocked]
    return ProbeResult(tuple(items))


REQUIRED_SECTIONS = ("links", "addrs", "routes4", "routes6", "sysctls", "backstop4", "backstop6")


def _sections(text: str) -> dict[str, str]:
    """Sections by name. Each must end with `### rc 0`: a tool that failed, a section cut
    short, or a missing one is InvalidInput naming the section and what the tool said."""
    out: dict[str, list[str]] = {}
    codes: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("### rc "):
            if current is not None:
                codes[current] = line[7:].strip()
        elif line.startswith("### "):
            current = line[4:].strip()
            out[current] = []
        elif current is not None:
            out[current].append(line)
    for name in (*REQUIRED_SECTIONS, *out):
        if name not in out:
            raise InvalidInput(f"helper state dump: no {name!r} section")
        if codes.get(name) != "0":
            said = " ".join(out[name])[:300] or "no output"
            raise InvalidInput(
                f"helper state dump: {name!r} failed (exit {codes.get(name, 'missing')}): {said}"
            )
    return {k: "\n".join(v) for k, v in out.items()}


def _json(sections: dict[str, str], name: str) -> list[dict[str, Any]]:
    try:
        data = json.loads(sections.get(name) or "[]")
    except ValueError:
        raise InvalidInput(f"helper state dump: section {name!r} is not JSON") from None
    if not isinstance(data, list):
        raise InvalidInput(f"helper state dump: section {name!r} is not a list")
    return data


def parse_state_dump(text: str, nameservers: tuple[str, ...] = ()) -> NamespaceState:
    """The helper's `state_script` output as a NamespaceState; InvalidInput if malformed."""
    try:
        return _parse_state_dump(text, nameservers)
    except InvalidInput:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InvalidInput(f"helper state dump: unexpected content ({exc!r})") from None


def _parse_state_dump(text: str, nameservers: tuple[str, ...]) -> NamespaceState:
    s = _sections(text)
    links = tuple(
        Link(int(x["ifindex"]), str(x["ifname"]), "LOOPBACK" in x.get("flags", ()))
        for x in _json(s, "links")
    )
    index = {link.name: link.index for link in links}
    addrs = tuple(_addr(x, info) for x in _json(s, "addrs") for info in x.get("addr_info", ()))
    routes = tuple(
        _route(family, x, index)
        for family, name in ((AF_INET, "routes4"), (AF_INET6, "routes6"))
        for x in _json(s, name)
    )
    lookups = tuple(
        _lookup(name[4:], _json(s, name), index) for name in s if name.startswith("get ")
    )
    sysctls = tuple(_sysctl(line) for line in s.get("sysctls", "").splitlines() if line.strip())
    backstop = tuple(
        f for f, name in ((AF_INET, "backstop4"), (AF_INET6, "backstop6")) if _yes(s, name)
    )
    filters = None
    if "rules4" in s:  # a verify dump (state_script(verify=True))
        filters = tuple(
            FilterDump(
                f, _rule_specs(s[f"output{v}"], "OUTPUT"), _rule_specs(s[f"chain{v}"], CHAIN)
            )
            for f, v in ((AF_INET, "4"), (AF_INET6, "6"))
            if f in backstop and f"output{v}" in s
        )
    policy_rules = None
    if "rules4" in s:
        policy_rules = tuple(
            _policy_rule(family, x)
            for family, name in ((AF_INET, "rules4"), (AF_INET6, "rules6"))
            for x in _json(s, name)
        )
    if not any(link.loopback and link.name == "lo" for link in links):
        raise InvalidInput("helper state dump: no loopback interface (`ip` answered nothing)")
    if not any(r.table == RT_TABLE_LOCAL for r in routes):
        raise InvalidInput("helper state dump: no local routes (`ip route` answered nothing)")
    return NamespaceState(
        links, addrs, routes, sysctls, nameservers, lookups, backstop, filters, policy_rules,
        redirect=s.get("redirect", "").strip() == "yes",
    )


# `iptables -S` options and the SeenRule fields they fill (python-iptables' names).
_RULE_FIELDS = {"-p": "proto", "-s": "src", "-d": "dst", "-i": "in_iface", "-o": "out_iface"}


def _rule_specs(text: str, chain: str) -> tuple[SeenRule, ...]:
    """`iptables -S CHAIN` lines (`-A CHAIN ...`) as SeenRules, in order; the policy line
    (`-P`) and the chain's own (`-N`) are skipped."""
    return tuple(
        parse_rule_spec(line) for line in text.splitlines() if line.startswith(f"-A {chain} ")
    )


def _chain_specs(text: str) -> tuple[SeenRule, ...]:
    return _rule_specs(text, CHAIN)


def parse_rule_spec(line: str) -> SeenRule:
    """One `-A CHAIN ...` line as the SeenRule python-iptables would decode for it (direct
    mode's `backstop.dump`), so verify.py compares both modes' dumps the same way. A negated
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


def _policy_rule(family: int, x: dict[str, Any]) -> PolicyRule:
    """One `ip -j -N rule show` entry; `action` is a table lookup when a table is named."""
    parts = []
    for key, word, length in (("src", "from", "srclen"), ("dst", "to", "dstlen")):
        if key in x and x[key] != "all":
            parts.append(f"{word} {x[key]}/{x.get(length, 32 if family == AF_INET else 128)}")
    for key, word in (("iif", "iif"), ("oif", "oif"), ("fwmark", "fwmark")):
        if key in x:
            parts.append(f"{word} {x[key]}")
    table = str(x.get("table", "0"))
    return PolicyRule(
        family=family,
        priority=int(x.get("priority", 0)),
        table=int(table) if table.isdigit() else 0,
        action=FR_ACT_TO_TBL if "table" in x and "action" not in x else 0,
        selector=" ".join(parts) or "from all",
    )


def _yes(sections: dict[str, str], name: str) -> bool:
    answer = sections[name].strip()
    if answer not in ("yes", "no"):
        raise InvalidInput(f"helper state dump: {name!r} answered {answer[:200]!r}")
    return answer == "yes"


def _addr(link: dict[str, Any], info: dict[str, Any]) -> Addr:
    family = AF_INET6 if info.get("family") == "inet6" else AF_INET
    return Addr(
        family,
        str(info["local"]),
        int(info["prefixlen"]),
        int(link["ifindex"]),
        str(link["ifname"]),
        0,
        int(info.get("scope", 0)),
    )


def _dst(family: int, text: str) -> tuple[str | None, int]:
    if text == "default":
        return None, 0
    addr, _, length = text.partition("/")
    return addr, int(length) if length else (128 if family == AF_INET6 else 32)


def _route(family: int, x: dict[str, Any], index: dict[str, int]) -> Route:
    dst, dst_len = _dst(family, str(x.get("dst", "default")))
    dev = x.get("dev")
    metrics = tuple(
        ("RTAX_" + str(k).upper(), int(v)) for item in x.get("metrics", ()) for k, v in item.items()
    )
    return Route(
        family=family,
        dst=dst,
        dst_len=dst_len,
        oif=index.get(dev) if dev else None,
        ifname=dev,
        table=int(x.get("table", 254)),
        type=int(x.get("type", 1)),
        gateway=x.get("gateway"),
        proto=int(x.get("protocol", 3)),
        scope=int(x.get("scope", 0)),
        prefsrc=x.get("prefsrc"),
        priority=int(x["metric"]) if "metric" in x else None,
        tos=int(x.get("tos", 0) or 0) if str(x.get("tos", "0")).isdigit() else 0,
        flags=RTNH_F_ONLINK if "onlink" in x.get("flags", ()) else 0,
        pref=_PREFS.get(str(x["pref"])) if "pref" in x else None,
        metrics=metrics,
    )


def _lookup(addr: str, items: list[dict[str, Any]], index: dict[str, int]) -> Lookup:
    if not items:
        return Lookup(addr, None)
    x = items[0]
    dev = x.get("dev")
    kind = str(x.get("type", "1"))  # numeric with -N; a name from older iproute2
    rtype = int(kind) if kind.isdigit() else (RTN_LOCAL if kind == "local" else RTN_UNICAST)
    return Lookup(
        addr, rtype, index.get(dev) if dev else None, dev, x.get("gateway"), x.get("prefsrc")
    )


def _sysctl(line: str) -> tuple[str, str]:
    path, _, value = line.partition(" ")
    return path.removeprefix("/proc/sys/"), value.strip()

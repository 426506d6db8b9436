"""Plan ops as shell commands for the helper container, and the scripts that dump its state
and probe from it. Pure: text in, text or data out. The dump is parsed back into a
NamespaceState by `helper/dump.py`.

The helper image carries iproute2 (`ip`, `ss`) and the netfilter backend's tools (iptables'
legacy backend, the same one python-iptables drives in direct mode, so either mode sees the
other's backstop); the backend's shell face (netfilter.py) writes its commands. A cut script
runs under `set -e` and stops at the first failure; the caller then runs the rollback script,
whose commands, like restore's, tolerate what is already undone.

No busybox is assumed (docs/netcut.md#helper-mode): `PRELUDE` finds every tool by absolute
path, skipping busybox applets (Debian's busybox ash runs its own `ip` applet ahead of PATH,
and that applet has no `-j`), and the scripts call them through `ncut_*` functions, whose names
no shell has a builtin or applet for. Every state dump proves itself: each tool's exit status is
printed after its output, and `dump.parse_state_dump` refuses a dump with a failed tool,
without the loopback interface, or with output that does not parse, so a broken helper can
never make an empty namespace look cut.
"""

from __future__ import annotations

import shlex

from netcut.netfilter import ShellNetfilter, backend
from netcut.plan.changes import (
    AddAddr,
    AddBackstop,
    AddRedirect,
    AddRoute,
    DelAddr,
    DelRoute,
    KillFlows,
    Op,
    RemoveBackstop,
    RemoveRedirect,
    SetSysctl,
)
from netcut.plan.model import AF_INET6, Keep, ProbeItem, ProbeResult

_TOLERANT = " 2>/dev/null || true"
# The netfilter backend (netfilter.py chooses it), as helper mode drives it.
NETFILTER: ShellNetfilter = backend()


# Where the helper looks for its tools, in order: the default image's own directory first
# (helper/image.py), then the usual places of a user-supplied image.
TOOL_DIRS = ("/netcut/bin", "/usr/sbin", "/sbin", "/usr/bin", "/bin")
_TOOLS = {
    "timeout": "timeout",
    "nc": "nc",
    "bash": "bash",
    "busybox": "busybox",
    # what the helper reports about the namespace it sees (`facts_script`)
    "stat": "stat",
    "readlink": "readlink",
    "nftsave": "iptables-nft-save",
}


def prelude(tools: dict[str, str]) -> str:
    """Shell that finds each of `tools` (and iproute2's and the probe's) by absolute path as
    `ncut_NAME` (see the module docstring), and where the net sysctls are writable."""
    found = {"ip": "ip", "ss": "ss", **tools, **_TOOLS}
    return (
        _PRELUDE_HEAD
        + "".join(
            f'ncut_find NCUT_{n.upper()} {tool}; ncut_{n}() {{ "$NCUT_{n.upper()}" "$@"; }}\n'
            for n, tool in found.items()
        )
        + _PRELUDE_SYS
    )


_PRELUDE_HEAD = (
    "exec 2>&1\n"
    # ncut_find VAR TOOL: VAR=the first executable TOOL in TOOL_DIRS that is not a busybox
    # applet (no subshell, no fork for the default image's own /netcut/bin).
    "ncut_find() { for d in " + " ".join(TOOL_DIRS) + '; do f=$d/$2; [ -x "$f" ] || continue;'
    ' if [ "$d" != /netcut/bin ] && [ -L "$f" ]; then'
    ' case "$(readlink "$f" 2>/dev/null)" in *busybox*) continue;; esac; fi;'
    ' eval "$1=\\$f"; return 0; done; eval "$1=/missing/$2"; }\n'
)
# Where the net sysctls are writable: /proc/sys (docker and podman unmask it), or the bind
# mount a containerd helper gets, which ctr cannot unmask (container.helper_argv).
_PRELUDE_SYS = "NCUT_SYS=/proc/sys; if [ -d /netcut/sys/net ]; then NCUT_SYS=/netcut/sys; fi\n"
PRELUDE = prelude(NETFILTER.tools)


def _q(args: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in args)


def _fam(family: int) -> str:
    return "-6" if family == AF_INET6 else "-4"


def render_op(op: Op) -> list[str]:
    """Shell commands equivalent to `op` (direct/executor.py's dispatcher, in iproute2 and the
    netfilter backend's tools)."""
    if isinstance(op, AddBackstop):
        return NETFILTER.install_backstop(op.family, op.rules)
    if isinstance(op, RemoveBackstop):
        return NETFILTER.remove_backstop(op.family)
    if isinstance(op, AddRedirect):
        return NETFILTER.install_redirects(op.rules)
    if isinstance(op, RemoveRedirect):
        return NETFILTER.remove_redirects()
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
        return [f'echo {shlex.quote(op.value)} > "$NCUT_SYS"/{shlex.quote(op.key)}']
    if isinstance(op, KillFlows):
        return [_kill_flows(op)]
    raise RuntimeError(f"unexpected {op!r}")


def render_batched(op: Op) -> list[str]:
    """`render_op`, but a backstop's install or removal as the backend's batch (one
    `-save` and one `-restore` per family in the default image), which falls back to
    `render_op`'s commands by itself in an image without those tools."""
    if isinstance(op, AddBackstop | RemoveBackstop):
        rules = op.rules if isinstance(op, AddBackstop) else None
        batch = NETFILTER.batched_backstop(op.family, rules)
        if batch is not None:
            return [batch]
    return render_op(op)


def render_batched_script(ops: tuple[Op, ...], *, tolerant: bool = False) -> str:
    """`render_script` with `render_batched`: what the helper session runs."""
    lines = [line for op in ops for line in render_batched(op)]
    if tolerant:
        lines = [line if line.endswith(_TOLERANT) else line + _TOLERANT for line in lines]
        return "\n".join(lines) + "\n"
    return "set -e\n" + "\n".join(lines) + "\n"


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
    """A script whose output `dump.parse_state_dump` reads: JSON from `ip`, sysctls, the
    netfilter backend's sections (its marks; with `verify` also the backstop's rules as it
    wrote them), and with `verify` the policy rules, which status compares with the plan
    (docs/netcut.md#status).

    Each section is followed by `### rc N`, the exit status of the command that produced it."""
    # One `ip -j addr show` answers both links and addresses (it lists every link, with
    # its index, name and flags, addresses or none): one tool run, two sections.
    lines = [
        "ncut_a=$(ncut_ip -j -N addr show); ncut_ar=$?",
        section("links", "ip -j -N addr show", 'echo "$ncut_a"; (exit $ncut_ar)'),
        section("addrs", "ip -j -N addr show", 'echo "$ncut_a"; (exit $ncut_ar)'),
        *_route_sections(),
    ]
    for keep in keeps:
        if not keep.is_loopback:
            # No route at all is an answer (an error exit), not a broken tool.
            addr = shlex.quote(str(keep.addr))
            lines.append(
                f"echo '### get {keep.addr}'; ncut_ip -d -N -j route get {addr} 2>/dev/null"
                " || echo '[]'; echo '### rc 0'"
            )
    # Never a builtin's status for procfs: on Linux 6.18 `read` in dash and busybox ash
    # returns 1 for a /proc/sys file although it read the value (bash returns 0). A sysctl
    # always has a value, so an empty one is the failure (docs/netcut.md#helper-mode).
    lines.append(
        section(
            "sysctls",
            "read each /proc/sys/net/ipv6/conf/*/{disable_ipv6,accept_ra}",
            "r=0; for f in /proc/sys/net/ipv6/conf/*/disable_ipv6"
            ' /proc/sys/net/ipv6/conf/*/accept_ra; do [ -e "$f" ] || continue;'
            ' v=; read -r v < "$f"; if [ -n "$v" ]; then echo "$f $v";'
            ' else echo "$f: no value read"; r=1; fi; done; (exit $r)',
        )
    )
    lines += NETFILTER.dump(section, verify)
    if verify:
        lines.append(section("rules4", "ip -j -N -4 rule show", "ncut_ip -j -N -4 rule show"))
        lines.append(
            section(
                "rules6",
                "ip -j -N -6 rule show",
                "if [ -d /proc/sys/net/ipv6 ]; then ncut_ip -j -N -6 rule show; else echo '[]'; fi",
            )
        )
    return "\n".join(lines) + "\n"


def marks_script() -> str:
    """A script whose output `dump.parse_marks_dump` reads: netcut's marks alone, the check
    after a restore's undo. Both families' routes and the netfilter backend's sections; no
    links, addresses or sysctls, which a restore never plans from (the one `ip addr` run
    is the dearest read in the helper: docs/netcut.md#helper-mode)."""
    return "\n".join([*_route_sections(), *NETFILTER.dump(section, False)]) + "\n"


def _route_sections() -> list[str]:
    return [
        section(
            "routes4",
            "ip -d -N -j -4 route show table all",
            "ncut_ip -d -N -j -4 route show table all",
        ),
        section(
            "routes6",
            "ip -d -N -j -6 route show table all",
            "if [ -d /proc/sys/net/ipv6 ]; then"
            " ncut_ip -d -N -j -6 route show table all; else echo '[]'; fi",
        ),
    ]


def section(name: str, command: str, body: str) -> str:
    """One state-dump section: its name, the command it runs (for the error when it fails:
    helper/dump.py quotes both with the whole output), the output, then `### rc N`."""
    return (
        f"echo '### {name}'; echo {shlex.quote('### cmd ' + command)}; {body}; echo \"### rc $?\""
    )


def probe_script(reachable: tuple[Keep, ...], blocked: tuple[Keep, ...], timeout: float) -> str:
    """Connect to every target at once; one `connected T` or `failed T` line each.

    With the first connector the image has, whatever its /bin/sh: bash's /dev/tcp under
    `timeout` (the default image; Debian-like images), else `nc -z -w` (netcat), else
    busybox's `nc -w SECS ADDR PORT -e true`, which connects and exits 0 (its `nc` has no
    `-z`; an Alpine-like image). Each is bounded by `timeout` seconds."""
    secs = str(max(1, round(timeout)))
    lines = [
        'ncut_probe() { if [ -x "$NCUT_BASH" ] && [ -x "$NCUT_TIMEOUT" ]; then'
        ' ncut_timeout "$3" "$NCUT_BASH" -c \'exec 3<>"/dev/tcp/$0/$1"\' "$1" "$2";'
        ' elif [ -x "$NCUT_NC" ]; then ncut_nc -z -w "$3" "$1" "$2";'
        ' else ncut_busybox nc -w "$3" "$1" "$2" -e true; fi </dev/null >/dev/null 2>&1'
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


# ---------------------------------------------------------------- what the helper sees
#
# The helper is the only party that sees the namespace from inside: the host process of a
# user who is not root can read neither /proc/PID/ns/net nor /proc/PID/root/etc/resolv.conf
# of a container's process. So the helper reports the namespace's identity (by which its
# record is keyed) and its resolvers: the container's own resolv.conf (docker and podman give
# a helper that joins a container's network the same file) and where the engine redirects
# DNS (Docker's embedded resolver: a DNAT of 127.0.0.11:53 in the namespace's nat table,
# written with iptables-nft or legacy iptables). helper/dump.py's `parse_facts` reads them.
# Every line of a file the container can write is prefixed, so none can pass for a section.


def identity_script() -> str:
    """Section `netns`: `DEV INODE` of /proc/self/ns/net (stat), or its link
    `net:[INODE]` (readlink; the host adds nsfs's device, which is the same everywhere),
    or `unknown` when the image has neither tool."""
    return section(
        "netns",
        "stat -L -c '%d %i' /proc/self/ns/net",
        'if [ -x "$NCUT_STAT" ]; then ncut_stat -L -c "%d %i" /proc/self/ns/net;'
        ' elif [ -x "$NCUT_READLINK" ]; then ncut_readlink /proc/self/ns/net;'
        ' elif [ -x "$NCUT_BUSYBOX" ]; then ncut_busybox readlink /proc/self/ns/net;'
        " else echo unknown; fi",
    )


def resolvers_script() -> str:
    """Section `resolv`: the helper's /etc/resolv.conf (the target container's own), each
    line as `> LINE`, or `none` when there is no such file."""
    return section(
        "resolv",
        "read /etc/resolv.conf",
        "if [ -e /etc/resolv.conf ]; then r=0;"
        ' while IFS= read -r l || [ -n "$l" ]; do echo "> $l"; l=; done < /etc/resolv.conf'
        " || r=1; (exit $r); else echo none; fi",
    )


def dns_nat_script() -> str:
    """Section `dnsnat`: the nat table's rules as the engine wrote them, each as
    `nft> RULE` (iptables-nft) or `legacy> RULE` (legacy iptables, looked at only when
    registered: listing would register it); `unreadable nft` when the image has no
    iptables-nft-save, so a DNAT written there cannot be seen."""
    return section(
        "dnsnat",
        "iptables-nft-save -t nat; iptables-legacy -S -t nat",
        'r=0; if [ -x "$NCUT_NFTSAVE" ]; then out=$(ncut_nftsave -t nat 2>&1) || r=$?;'
        ' [ $r = 0 ] && printf "%s\\n" "$out" | while IFS= read -r l || [ -n "$l" ];'
        ' do echo "nft> $l"; l=; done; else echo "unreadable nft"; fi;'
        " t=no; " + '{ while read -r n || [ -n "$n" ]; do [ "$n" = nat ] && t=yes; n=;'
        " done < /proc/net/ip_tables_names; } 2>/dev/null;"
        " if [ $r = 0 ] && [ $t = yes ]; then out=$(ncut_iptables -w -t nat -S 2>&1) || r=$?;"
        ' [ $r = 0 ] && printf "%s\\n" "$out" | while IFS= read -r l || [ -n "$l" ];'
        ' do echo "legacy> $l"; l=; done; fi;'
        ' [ $r = 0 ] || echo "$out"; (exit $r)',
    )


def facts_script() -> str:
    """What the helper reports before anything else (helper/session.py): the namespace's
    identity, its resolvers and the engine's DNS redirection."""
    return "\n".join((identity_script(), resolvers_script(), dns_nat_script())) + "\n"


# ---------------------------------------------------------------- the resolvers, probed

# The query's id: printable, so a shell can tell an answer from nothing (`read` drops NULs).
_QUERY_ID = b"NC"


def _query_name(name: str) -> str:
    """`name` as the probe asks it: letters, digits, `-`, `_` and dots only (a container's
    name always is), else a name under `.invalid`."""
    ok = all(c.isascii() and (c.isalnum() or c in "-_.") for c in name)
    return name.strip(".") if ok and name.strip(".") else "netcut-probe.invalid"


def dns_query(name: str) -> bytes:
    """A DNS query (type A, recursion desired) for `name`: what the probe sends to each
    resolver, which must not answer. A name a resolver answers itself is best (the
    container's own name: Docker's embedded DNS answers it without asking upstream)."""
    labels = [p for p in _query_name(name).split(".") if p]
    qname = b"".join(bytes([len(p[:63])]) + p[:63].encode("ascii", "replace") for p in labels)
    return _QUERY_ID + b"\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00" + qname + b"\x00\x00\x01\x00\x01"


def dns_probe_script(resolvers: tuple[str, ...], name: str, timeout: float) -> str:
    """Send `dns_query(name)` to port 53 of every resolver at once; one `answered dns:ADDR`
    or `silent dns:ADDR` line each. bash's /dev/udp under `timeout` (reads the answer's
    first byte, its id's: bash reads byte by byte, and the rest of a datagram is gone after
    the first read), else netcat's `nc -u`, else busybox's `nslookup` (Debian's busybox `nc`
    has no `-u`), whose output tells an answer, NXDOMAIN included, from none; any answer at
    all is a way out."""
    secs = str(max(1, round(timeout)))
    query = "".join(f"\\{b:03o}" for b in dns_query(name))
    lines = [
        f"ncut_q={shlex.quote(query)}",
        f"ncut_qname={shlex.quote(_query_name(name))}",
        'ncut_dns() { if [ -x "$NCUT_BASH" ] && [ -x "$NCUT_TIMEOUT" ]; then'
        ' ncut_timeout "$2" "$NCUT_BASH" -c \'exec 3<>"/dev/udp/$0/53" && printf "$1" >&3'
        ' && IFS= read -r -n 1 x <&3 && [ "$x" = N ]\' "$1" "$ncut_q";'
        ' elif [ -x "$NCUT_NC" ]; then out=$(printf "$ncut_q" | ncut_nc -u -w "$2" "$1" 53);'
        ' [ -n "$out" ];'
        ' else out=$("$NCUT_BUSYBOX" timeout "$2" "$NCUT_BUSYBOX" nslookup "$ncut_qname" "$1"'
        ' 2>&1); case "$out" in *"Name:"*|*"can\'t find"*|*"answer:"*) true;; *) false;; esac;'
        ' fi </dev/null 2>/dev/null && echo "answered dns:$1" || echo "silent dns:$1"; }',
    ]
    for addr in resolvers:
        lines.append(f"ncut_dns {_q([addr, secs])} &")
    lines.append("wait")
    return "\n".join(lines) + "\n"


def parse_dns_probe(text: str, resolvers: tuple[str, ...]) -> tuple[ProbeItem, ...]:
    """`dns_probe_script` output as probe items: each resolver expected blocked (`connected`
    when it answered, which fails the probe)."""
    outcomes: dict[str, str] = {}
    for line in text.splitlines():
        outcome, _, name = line.partition(" ")
        if name.startswith("dns:"):
            outcomes[name[4:].strip()] = "connected" if outcome == "answered" else "no answer"
    return tuple(
        ProbeItem(f"{_host(a)}:53 (DNS)", "blocked", outcomes.get(a, "not probed"))
        for a in resolvers
    )


def _host(addr: str) -> str:
    return f"[{addr}]" if ":" in addr else addr

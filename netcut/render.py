"""Plan ops as shell commands for the helper container, and the helper's state dump parsed
back into a NamespaceState. Pure: text in, text or data out.

The helper image carries iproute2 (`ip`, `ss`) and iptables' legacy backend (the same one
python-iptables drives in direct mode, so either mode sees the other's backstop). A cut script
runs under `set -e` and stops at the first failure; the caller then runs the rollback script,
whose commands, like restore's, tolerate what is already undone.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from netcut.errors import InvalidInput
from netcut.model import (
    AF_INET,
    AF_INET6,
    CHAIN,
    NAT_CHAIN,
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
    Keep,
    KillFlows,
    Link,
    Lookup,
    NamespaceState,
    Op,
    RemoveBackstop,
    RemoveRedirect,
    Route,
    SetSysctl,
)

_PREFS = {"medium": 0, "high": 1, "low": 3}
_TOLERANT = " 2>/dev/null || true"


def _tool(family: int) -> str:
    return "ip6tables-legacy" if family == AF_INET6 else "iptables-legacy"


def _q(args: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in args)


def _fam(family: int) -> str:
    return "-6" if family == AF_INET6 else "-4"


def render_op(op: Op) -> list[str]:
    """Shell commands equivalent to `op` (apply.py's dispatcher, in iproute2/iptables)."""
    if isinstance(op, AddBackstop):
        t = _tool(op.family)
        return [
            _q([t, "-w", "-N", CHAIN]),
            *(_q([t, "-w", "-A", CHAIN, *rule.iptables_args()]) for rule in op.rules),
            _q([t, "-w", "-I", "OUTPUT", "1", "-j", CHAIN]),
        ]
    if isinstance(op, RemoveBackstop):
        t = _tool(op.family)
        return [
            f"while {_q([t, '-w', '-D', 'OUTPUT', '-j', CHAIN])} 2>/dev/null; do :; done",
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
        return [_q(["ip", _fam(op.route.family), "route", verb, *op.route.ip_args()])]
    if isinstance(op, AddAddr | DelAddr):
        a = op.addr
        args = [
            "ip",
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
    return f"ss -K -t state connected {shlex.quote(expr)} >/dev/null" + _TOLERANT


def render_script(ops: tuple[Op, ...], *, tolerant: bool = False) -> str:
    """A /bin/sh script for `ops`: strict (`set -e`) for a cut, tolerant for undo."""
    lines = [line for op in ops for line in render_op(op)]
    if tolerant:
        lines = [line if line.endswith(_TOLERANT) else line + _TOLERANT for line in lines]
        return "\n".join(lines) + "\n"
    return "set -e\n" + "\n".join(lines) + "\n"


# ---------------------------------------------------------------- state dump


def state_script(keeps: tuple[Keep, ...]) -> str:
    """A script whose output `parse_state_dump` reads: JSON from `ip`, sysctls, chain marks."""
    lines = [
        "echo '### links'; ip -j link show",
        "echo '### addrs'; ip -j -N addr show",
        "echo '### routes4'; ip -d -N -j -4 route show table all",
        "echo '### routes6'; ip -d -N -j -6 route show table all 2>/dev/null || echo '[]'",
    ]
    for keep in keeps:
        if not keep.is_loopback:
            addr = shlex.quote(str(keep.addr))
            lines.append(
                f"echo '### get {keep.addr}'; ip -d -N -j route get {addr} 2>/dev/null || echo '[]'"
            )
    lines.append(
        "echo '### sysctls'; for f in /proc/sys/net/ipv6/conf/*/disable_ipv6"
        ' /proc/sys/net/ipv6/conf/*/accept_ra; do [ -e "$f" ] && echo "$f $(cat "$f")"; done'
    )
    for family, name, names in ((AF_INET, "backstop4", "ip_tables_names"),
                                (AF_INET6, "backstop6", "ip6_tables_names")):  # fmt: skip
        # Look at the table only if it is registered: listing it would register it.
        check = f"grep -qx filter /proc/net/{names} 2>/dev/null && " + _q(
            [_tool(family), "-w", "-S", CHAIN]
        )
        lines.append(f"echo '### {name}'; {check} >/dev/null 2>&1 && echo yes || echo no")
    # transparent mode's redirect chain (nat), looked at only if the nat table is registered
    check = "grep -qx nat /proc/net/ip_tables_names 2>/dev/null && " + _q(
        [_tool(AF_INET), "-w", "-t", "nat", "-S", NAT_CHAIN]
    )
    lines.append(f"echo '### redirect'; {check} >/dev/null 2>&1 && echo yes || echo no")
    return "\n".join(lines) + "\n"


def _sections(text: str) -> dict[str, str]:
    out: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("### "):
            current = line[4:].strip()
            out[current] = []
        elif current is not None:
            out[current].append(line)
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
        f
        for f, name in ((AF_INET, "backstop4"), (AF_INET6, "backstop6"))
        if s.get(name, "").strip() == "yes"
    )
    redirect = s.get("redirect", "").strip() == "yes"
    return NamespaceState(links, addrs, routes, sysctls, nameservers, lookups, backstop,
                          redirect=redirect)  # fmt: skip


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

"""The helper's state dump (`render.state_script`'s output) parsed back into a
`NamespaceState`. Pure: text in, data out.

Every dump proves itself: each section ends with its tool's exit status, and a dump with a
failed tool, a missing section, or output that does not parse is `InvalidInput` naming the
section, so a broken helper can never make an empty namespace look cut
(docs/netcut.md#helper-mode).
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from typing import Any

from netcut.errors import InvalidInput
from netcut.helper.script import NETFILTER
from netcut.plan.model import (
    AF_INET,
    AF_INET6,
    FR_ACT_TO_TBL,
    NETCUT_PROTO,
    RT_TABLE_LOCAL,
    RTN_LOCAL,
    RTN_UNICAST,
    RTNH_F_ONLINK,
    Addr,
    Link,
    Lookup,
    NamespaceState,
    PolicyRule,
    Route,
)

_PREFS = {"medium": 0, "high": 1, "low": 3}  # `ip -6 route` pref names -> RTA_PREF
REQUIRED_SECTIONS = ("links", "addrs", "routes4", "routes6", "sysctls", *NETFILTER.sections)
MARKS_SECTIONS = ("routes4", "routes6", *NETFILTER.sections)


def read_sections(text: str, required: tuple[str, ...] = REQUIRED_SECTIONS) -> dict[str, str]:
    """Sections by name. Each must end with `### rc 0`: a tool that failed, a section cut
    short, or a missing one (of `required`) is InvalidInput naming the section, the command
    it ran (its `### cmd` line) and everything the command said, every line."""
    out: dict[str, list[str]] = {}
    codes: dict[str, str] = {}
    commands: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("### rc "):
            if current is not None:
                codes[current] = line[7:].strip()
        elif line.startswith("### cmd "):
            if current is not None:
                commands[current] = line[8:].strip()
        elif line.startswith("### "):
            current = line[4:].strip()
            out[current] = []
        elif current is not None:
            out[current].append(line)
    for name in (*required, *out):
        if name not in out:
            raise InvalidInput(f"helper state dump: no {name!r} section")
        if codes.get(name) != "0":
            said = "\n".join(out[name]).strip() or "no output"
            command = f" (`{commands[name]}`)" if name in commands else ""
            raise InvalidInput(
                f"helper state dump: {name!r}{command} failed"
                f" (exit {codes.get(name, 'missing')}); it said:\n{said}"
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
    s = read_sections(text)
    links = tuple(
        Link(int(x["ifindex"]), str(x["ifname"]), "LOOPBACK" in x.get("flags", ()))
        for x in _json(s, "links")
    )
    index = {link.name: link.index for link in links}
    addrs = tuple(_addr(x, info) for x in _json(s, "addrs") for info in x.get("addr_info", ()))
    routes = _routes(s, index)
    lookups = tuple(
        _lookup(name[4:], _json(s, name), index) for name in s if name.startswith("get ")
    )
    sysctls = tuple(_sysctl(line) for line in s.get("sysctls", "").splitlines() if line.strip())
    # a verify dump (script.state_script) carries the policy rules
    backstop, filters, redirect = NETFILTER.read_dump(s, verify="rules4" in s)
    policy_rules = None
    if "rules4" in s:
        policy_rules = tuple(
            _policy_rule(family, x)
            for family, name in ((AF_INET, "rules4"), (AF_INET6, "rules6"))
            for x in _json(s, name)
        )
    if not any(link.loopback and link.name == "lo" for link in links):
        raise InvalidInput("helper state dump: no loopback interface (`ip` answered nothing)")
    return NamespaceState(
        links,
        addrs,
        routes,
        sysctls,
        nameservers,
        lookups,
        backstop,
        filters,
        policy_rules,
        redirect=redirect,
    )


def parse_marks_dump(text: str) -> NamespaceState | None:
    """The helper's `marks_script` output as netcut's marks (`NamespaceState.marks()`), or
    None when it shows a marked route: the marks name its link, which this dump does not
    read (a restore that left one reads the whole state: helper/session.py). InvalidInput
    if malformed."""
    try:
        s = read_sections(text, MARKS_SECTIONS)
        marked = [r for r in _routes(s, {}) if r.proto == NETCUT_PROTO]
        backstop, _, redirect = NETFILTER.read_dump(s, verify=False)
    except InvalidInput:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InvalidInput(f"helper marks dump: unexpected content ({exc!r})") from None
    if marked:
        return None
    return NamespaceState(links=(), addrs=(), routes=(), backstop=backstop, redirect=redirect)


def _routes(s: dict[str, str], index: dict[str, int]) -> tuple[Route, ...]:
    """Both families' routes; the local table's are always there, so none is `ip route`
    answering nothing (a tool that prints nothing must never pass for a namespace without
    netcut's routes)."""
    routes = tuple(
        _route(family, x, index)
        for family, name in ((AF_INET, "routes4"), (AF_INET6, "routes6"))
        for x in _json(s, name)
    )
    if not any(r.table == RT_TABLE_LOCAL for r in routes):
        raise InvalidInput("helper state dump: no local routes (`ip route` answered nothing)")
    return routes


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


# ---------------------------------------------------------------- what the helper sees


@dataclass(frozen=True)
class HelperFacts:
    """What the helper reported from inside the namespace (helper/script.py's
    `facts_script`). `identity` is (st_dev, st_ino) of its /proc/self/ns/net, st_dev None
    when it could only read the inode (the host fills in nsfs's device); None when it could
    read neither. `nameservers` are the container's resolv.conf's, `dns_nat` the addresses
    the engine's nat rules send DNS to, or from (Docker: 127.0.0.11); `unverified` says
    why the DNS part cannot be trusted (a nat table the helper cannot read)."""

    identity: tuple[int | None, int] | None
    nameservers: tuple[str, ...]
    dns_nat: tuple[str, ...]
    unverified: tuple[str, ...] = ()

    @property
    def resolvers(self) -> tuple[str, ...]:
        """Every address a DNS query may be sent to: resolv.conf's, then the nat rules'."""
        return tuple(dict.fromkeys((*self.nameservers, *self.dns_nat)))


def parse_facts(text: str) -> HelperFacts:
    """`facts_script` output as HelperFacts; InvalidInput when malformed (a tool failed, a
    section is missing): a helper that cannot report what it sees never makes a cut."""
    s = read_sections(text, ("netns", "resolv", "dnsnat"))
    nameservers = _nameservers(s["resolv"])
    dns_nat, unverified = _dns_nat(s["dnsnat"])
    return HelperFacts(_identity(s["netns"].strip()), nameservers, dns_nat, unverified)


def parse_identity(text: str) -> HelperFacts:
    """`identity_script` output alone as HelperFacts (no resolvers: a restore's facts)."""
    return HelperFacts(_identity(read_sections(text, ("netns",))["netns"].strip()), (), ())


def _identity(text: str) -> tuple[int | None, int] | None:
    """`DEV INODE` (stat) or `net:[INODE]` (readlink)."""
    fields = text.split()
    if len(fields) == 2 and all(f.isdigit() and len(f) < 21 for f in fields):
        return int(fields[0]), int(fields[1])
    if text.startswith("net:[") and text.endswith("]") and text[5:-1].isdigit():
        return None, int(text[5:-1][:20])
    return None


def _address(text: str) -> str | None:
    """An IP address as the plan writes it (zone dropped), or None for anything else."""
    try:
        return str(ipaddress.ip_address(text.split("%", 1)[0]))
    except ValueError:
        return None


def _nameservers(section: str) -> tuple[str, ...]:
    """The `nameserver` addresses of the prefixed resolv.conf lines (not addresses: skipped)."""
    found: list[str] = []
    for line in section.splitlines():
        if not line.startswith("> "):
            continue
        fields = line[2:].split()
        if len(fields) >= 2 and fields[0] == "nameserver":
            addr = _address(fields[1])
            if addr is not None:
                found.append(addr)
    return tuple(dict.fromkeys(found))


def _dns_nat(section: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Addresses of every nat rule that rewrites DNS: a DNAT (or REDIRECT) whose match names
    port 53 or whose target does (`--to-destination ADDR:53`); its `-d` address (what a
    client asks: 127.0.0.11) and its target address (where the query goes)."""
    found: list[str] = []
    unverified: list[str] = []
    for line in section.splitlines():
        if line.strip() == "unreadable nft":
            unverified.append("the helper image has no iptables-nft-save to read nat rules")
            continue
        _, sep, rule = line.partition("> ")
        if not sep or not rule.startswith("-A "):
            continue
        words = rule.split()
        target = _after(words, "-j")
        if target not in ("DNAT", "REDIRECT"):
            continue
        to = _after(words, "--to-destination") or ""
        to_addr, _, to_port = to.rpartition(":") if to.count(":") == 1 else (to, "", "")
        if _after(words, "--dport") != "53" and to_port != "53":
            continue
        for text in (_after(words, "-d"), to_addr or None):
            if text:
                addr = _address(text.split("/", 1)[0])
                if addr is not None:
                    found.append(addr)
    return tuple(dict.fromkeys(found)), tuple(unverified)


def _after(words: list[str], flag: str) -> str | None:
    """The value after `flag` (never after a negated one: `! -d X` names what is not)."""
    for i, word in enumerate(words[:-1]):
        if word == flag and (i == 0 or words[i - 1] != "!"):
            return words[i + 1]
    return None

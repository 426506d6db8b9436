"""Transparent mode's part of a cut, as data. Pure.

Strategy. A cut namespace has no route out, so a tool that ignores proxy settings fails at
`connect()` (ENETUNREACH) before netfilter could see its packet. Transparent mode therefore
adds three things to the plan of a cut (docs/netcut.md#transparent-mode):

 1. a route `default dev lo src 127.0.0.1` (marked `proto netcut`): every destination now
    routes to the namespace's own loopback, which leads nowhere but the namespace itself;
 2. redirects that every packet sent meets first: DNS (UDP and TCP 53, whatever the
    address) is redirected to the DNS responder's port, loopback and the namespace's own
    addresses and the kept destinations pass, and every other TCP connection is redirected
    to the proxy's transparent listener on the namespace's loopback (the proxy reads the
    original destination with SO_ORIGINAL_DST);
 3. a narrower backstop: allowing all output to lo would now allow everything (every route
    leads to lo), so loopback is allowed only to local addresses (which the redirected
    connections are), and the DNS responder's port is allowed before port 53 is refused.
    UDP other than DNS, and everything not redirected, is still refused.

IPv4 only: a cut disables IPv6 on every interface but loopback.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from netcut.errors import InvalidInput
from netcut.plan.model import (
    AF_INET,
    NETCUT_PROTO,
    RT_SCOPE_LINK,
    Keep,
    NamespaceState,
    OutputRule,
    RedirectRule,
    Route,
)


@dataclass(frozen=True)
class Redirect:
    """Where redirected traffic goes: the proxy's transparent listener port and (optionally)
    its DNS responder port, both on the namespace's own 127.0.0.1."""

    port: int
    dns_port: int | None = None

    def __post_init__(self) -> None:
        for name, value in (("--redirect-to", self.port), ("--dns-to", self.dns_port)):
            if value is not None and not 0 < value < 65536:
                raise InvalidInput(f"{name} {value}: port must be 1-65535")


def redirect_rules(redirect: Redirect, keeps: tuple[Keep, ...]) -> tuple[RedirectRule, ...]:
    """The redirects, first match wins. Without a DNS port, DNS is not redirected and the
    backstop refuses it as in any cut."""
    rules: list[RedirectRule] = []
    if redirect.dns_port is not None:
        rules += [
            RedirectRule("redirect", proto="udp", dport=53, to_port=redirect.dns_port),
            RedirectRule("redirect", proto="tcp", dport=53, to_port=redirect.dns_port),
        ]
    rules.append(RedirectRule("pass", dst_local=True))
    for keep in keeps:
        if keep.addr.version != 4 or keep.is_loopback:
            continue
        if keep.port is None:
            rules.append(RedirectRule("pass", dst=f"{keep.addr}/32"))
        else:
            rules.append(RedirectRule("pass", proto="tcp", dst=f"{keep.addr}/32", dport=keep.port))
    rules.append(RedirectRule("redirect", proto="tcp", to_port=redirect.port))
    return tuple(rules)


def loopback_default_route(state: NamespaceState) -> Route:
    """`default dev lo src 127.0.0.1 proto netcut`: lets every connect() reach netfilter."""
    lo = next((link for link in state.links if link.loopback), None)
    if lo is None:
        raise InvalidInput("transparent mode: the namespace has no loopback interface")
    return Route(
        family=AF_INET,
        dst=None,
        dst_len=0,
        oif=lo.index,
        ifname=lo.name,
        proto=NETCUT_PROTO,
        scope=RT_SCOPE_LINK,
        prefsrc="127.0.0.1",
    )


def transparent_backstop(
    rules: tuple[OutputRule, ...], redirect: Redirect
) -> tuple[OutputRule, ...]:
    """The IPv4 backstop of a transparent cut, from the ordinary one (see the strategy)."""
    out: list[OutputRule] = []
    if redirect.dns_port is not None:
        for proto in ("udp", "tcp"):
            dns = OutputRule("allow", proto, "127.0.0.1/32", redirect.dns_port, out_iface="lo")
            out.append(dns)
    for rule in rules:
        if rule == OutputRule("allow", out_iface="lo"):
            rule = replace(rule, dst_local=True)
        out.append(rule)
    return tuple(out)


__all__ = ["Redirect", "loopback_default_route", "redirect_rules", "transparent_backstop"]

"""`egress check`: judge targets as written, without a proxy (pure but for --resolve-names).

A TARGET is a URL (`http://h/` is an absolute-form request, `https://h:8443/` a CONNECT) or
`host[:port]` (a CONNECT; a bare host means port 443). It is judged by the policy plus the pure
part of the address guard (IP literals in every spelling); names are resolved only when asked.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .config import Settings
from .errors import TargetError
from .policy.judge import judge
from .policy.rules import Decision
from .policy.target import (
    IPAddress,
    Target,
    canonical_addresses,
    make_target,
    parse_url,
    split_host_port,
)

Resolver = Callable[[str], Sequence[IPAddress]]


@dataclass(frozen=True, slots=True)
class CheckResult:
    text: str
    target: Target
    decision: Decision
    addrs: tuple[IPAddress, ...] = ()

    def line(self) -> str:
        why = f"{self.decision.reason}: {self.decision.detail}"
        if self.decision.rule is not None and self.decision.rule not in self.decision.detail:
            why += f" [{self.decision.rule}]"
        return f"{self.decision.action} {self.text} {why}"


def parse_check_target(text: str) -> Target:
    """Parse a TARGET of `egress check`; raise `TargetError` naming it."""
    if "://" in text:
        return parse_url(text, schemes=("http", "https")).target
    host, port = split_host_port(text)
    if port == "":
        raise TargetError(f"target {text!r}: empty port")
    if port is not None and not (port.isascii() and port.isdigit()):
        raise TargetError(f"target {text!r}: invalid port {port!r}")
    return make_target("https", host, int(port) if port is not None else 443)


def system_resolver(host: str) -> tuple[IPAddress, ...]:
    """Resolve with the C library (only with --resolve-names)."""
    infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return canonical_addresses(info[4][0] for info in infos)


def check_target(settings: Settings, text: str, resolver: Resolver | None = None) -> CheckResult:
    """Judge one TARGET. With a `resolver`, names are resolved (pins first) and judged too."""
    target = parse_check_target(text)
    policy, guard = settings.policy, settings.guard
    decision = judge(policy, guard, target)
    addrs: tuple[IPAddress, ...] = ()
    if target.ip is None and (decision.allowed or decision.needs_addrs):
        pinned = settings.resolve.get(target.host)
        if pinned is not None:
            addrs = pinned
        elif resolver is not None:
            try:
                addrs = tuple(resolver(target.host))
            except OSError as exc:
                return CheckResult(
                    text, target, Decision(False, "dns_error", None, f"cannot resolve: {exc}")
                )
        if addrs:
            decision = judge(policy, guard, target, addrs)
    return CheckResult(text, target, decision, addrs)

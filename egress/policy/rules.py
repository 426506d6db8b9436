"""The policy: rules, and the pure decision over a canonical `Target`.

Evaluation order of `decide` (first match wins; every branch has a constant reason code):

 1. framework route on the exact host and port (any scheme)   -> allow  `framework_route`
 2. a block rule matching host (or any resolved address)       -> block  `block_rule`
 3. an allow rule matching host (or, for an address destination, its address; for a name
    only under `resolve_names_for_address_rules`, every resolved address) -> allow `allow_rule`
 4. default posture `allow`                                    -> allow  `default_allow`
 5. an allow rule matched the host but not this port/scheme    -> block  `port_not_allowed`
 6. default posture `deny`                                     -> block  `default_deny`

The address guard (reserved addresses, `addrs.py`) is a separate, later stage: a rule never
makes a reserved address reachable; only a framework route does.

No lookup decides nothing (docs/policy.md#no-lookup-decides-nothing): a refusal asks for the
name's addresses (`needs_addrs`) only when an allow address rule could still admit them on
this scheme and port past the blocks (`reach.py`, computed once when the policy is built;
`judge` then drops what the address guard refuses). Without the opt-in no refusal does.

Ports: an allow rule without port or scheme permits CONNECT to 443 and absolute-form HTTP to
80; a block rule without a port blocks every port and scheme; `host:port` covers both schemes
on that port; `host:*` (also `ADDR:*`, `CIDR:*`) every port and scheme, which is what Harbor's
and verifiers' host lists mean; a URL origin narrows to its scheme and port.

A rule's text is parsed by `grammar.py` (`parse_rule`, `Rule`), which this module, the
indexes and the reach all read. Rule matching is done on canonical strings on both sides
(`target.normalize_host`). Patterns are compiled once at load (`index.py`: exact names to a
dict, `*.suffix` patterns to a suffix dict, only the rest to regular expressions); decisions
can therefore be cached by target.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from ..errors import PolicyError, TargetError
from ..validate import as_bool, as_list
from .addrs import AddressGuard
from .grammar import Action, Rule, parse_rule
from .index import RuleSet
from .reach import NOWHERE, Reach, address_reach
from .target import (
    IPAddress,
    Target,
    parse_url,
)

Posture = Literal["deny", "allow"]


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of `decide`: allowed or not, a constant reason code, the deciding rule."""

    allowed: bool
    reason: str
    rule: str | None = None
    detail: str = ""
    # True when resolved addresses could still change the outcome: an allowed name under
    # block address rules (an allowed name is resolved in any case: the guard judges its
    # addresses), or a refusal an allow address rule could still turn into an allow
    # (docs/policy.md#no-lookup-decides-nothing); a refusal without it is final, and the
    # name is never resolved
    needs_addrs: bool = False
    # report-only mode (docs/policy.md#report-only-mode): "block" when the policy would have
    # refused; the decision is then an allow that keeps the refusal's reason, rule and detail
    would: str | None = None

    @property
    def action(self) -> Action:
        return "allow" if self.allowed else "block"


@dataclass(frozen=True, slots=True)
class FrameworkRoute:
    """A URL the framework serves; reachable on its exact host and port by any scheme."""

    text: str
    host: str
    port: int


def parse_framework_route(text: str) -> FrameworkRoute:
    """Parse a framework route URL (`http://127.0.0.1:8080/v1`); the path is ignored."""
    try:
        parsed = parse_url(text.strip(), schemes=("http", "https"))
    except TargetError as exc:
        raise PolicyError(f"framework route {text!r}: {exc}") from None
    return FrameworkRoute(text.strip(), parsed.target.host, parsed.target.port)


class Policy:
    """Allow and block rules, a default posture, and framework routes. Immutable after load.

    Raises `PolicyError` (quoting the rule) when a rule cannot be parsed.
    """

    def __init__(
        self,
        allow: Iterable[str | Rule] = (),
        block: Iterable[str | Rule] = (),
        default: Posture = "deny",
        framework_routes: Iterable[str | FrameworkRoute] = (),
        *,
        report_only: bool = False,
        resolve_names_for_address_rules: bool = False,
    ) -> None:
        # one validator for every entry point (docs/policy.md#types): `allow="*"` is a
        # TypeError, never the characters of a string taken as rules
        if not isinstance(default, str):
            raise TypeError(f"Policy default must be 'deny' or 'allow', not {default!r}")
        if default not in ("deny", "allow"):
            raise PolicyError(f"default posture {default!r}: must be 'deny' or 'allow'")
        self.default: Posture = default
        # docs/policy.md#report-only-mode: refusals become allows that say what would have
        # happened; the address guard still refuses
        # a bool, never a truthy string: report_only="false" would switch enforcement off
        self.report_only = as_bool(report_only, "Policy report_only")
        self._digest: str | None = None  # docs/policy.md#policy-hash, computed on first use
        # docs/policy.md#no-lookup-decides-nothing: allow address rules admit addresses only,
        # unless this opt-in lets them judge the addresses a name resolves to
        self.resolve_names_for_address_rules = as_bool(
            resolve_names_for_address_rules, "Policy resolve_names_for_address_rules"
        )
        rules = (str, Rule)
        self.allow_rules = tuple(
            _as_rule(r, "allow")  # type: ignore[arg-type]
            for r in as_list(allow, "Policy allow", rules)
        )
        self.block_rules = tuple(
            _as_rule(r, "block")  # type: ignore[arg-type]
            for r in as_list(block, "Policy block", rules)
        )
        self.framework_routes = tuple(
            r if isinstance(r, FrameworkRoute) else parse_framework_route(str(r))
            for r in as_list(framework_routes, "Policy framework_routes", (str, FrameworkRoute))
        )
        self._allow = RuleSet()
        self._block = RuleSet()
        for rule in self.allow_rules:
            self._allow.add(rule)
        for rule in self.block_rules:
            self._block.add(rule)
        self._routes = {(r.host, r.port): r for r in self.framework_routes}
        self.has_ip_rules = bool(self._allow.networks or self._block.networks)
        # where a name's addresses could still turn a refusal into an allow (past the blocks);
        # computed once here, so a decision asks one set membership (`reach.py`)
        self._reach: Reach = NOWHERE
        if self.resolve_names_for_address_rules:
            self._reach = address_reach(self._allow.networks, self._block.networks)
        self._reach_by_guard: dict[AddressGuard, Reach] = {}
        # ports named by an `https://` allow rule: tunnels there get the TLS SNI check too
        self.https_ports = frozenset(
            r.port for r in self.allow_rules if r.scheme == "https" and r.port is not None
        )

    def __repr__(self) -> str:
        return (
            f"Policy(default={self.default!r}, allow={len(self.allow_rules)}, "
            f"block={len(self.block_rules)}, routes={len(self.framework_routes)}"
            + (", report_only=True" if self.report_only else "")
            + (
                ", resolve_names_for_address_rules=True"
                if self.resolve_names_for_address_rules
                else ""
            )
            + ")"
        )

    def host_rules(self, action: Action, host: str) -> list[Rule]:
        """The host-form rules of `action` matching canonical `host` on any port or scheme,
        in definition order (the DNS responder asks which names may be answered)."""
        return (self._allow if action == "allow" else self._block).host_matches(host)

    def address_reach(self, guard: AddressGuard) -> Reach:
        """Where a name's addresses could still be allowed under `guard`: the build-time reach
        less the rules every address of which the guard refuses (computed once per guard)."""
        if self._reach.empty:
            return NOWHERE
        reach = self._reach_by_guard.get(guard)
        if reach is None:
            reach = address_reach(self._reach.rules, self._block.networks, guard)
            if len(self._reach_by_guard) >= 16:  # a guard changes rarely (host addresses)
                self._reach_by_guard.clear()
            self._reach_by_guard[guard] = reach
        return reach

    def canonical(self) -> dict[str, object]:
        """The policy as plain data, rules in their given order (docs/policy.md#policy-hash).

        Two policies with the same canonical form decide every request the same way; the
        opt-in `resolve_names_for_address_rules` appears only when set, so the hash of every
        policy without it is what it was before the key existed."""
        form: dict[str, object] = {
            "default": self.default,
            "allow": [r.text for r in self.allow_rules],
            "block": [r.text for r in self.block_rules],
            "framework_routes": [r.text for r in self.framework_routes],
            "mode": "report" if self.report_only else "enforce",
        }
        if self.resolve_names_for_address_rules:
            form["resolve_names_for_address_rules"] = True
        return form

    @property
    def digest(self) -> str:
        """`sha256:` + the first 16 hex digits of the SHA-256 of the canonical form's
        compact, key-sorted JSON; the `policy` field of every request record it decides."""
        if self._digest is None:
            text = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))
            self._digest = "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]
        return self._digest

    def framework_route(self, host: str, port: int) -> FrameworkRoute | None:
        return self._routes.get((host, port))

    def decide(self, target: Target, addrs: Sequence[IPAddress] = ()) -> Decision:
        """Judge `target` (and, if given, every address it resolved to). Pure."""
        return decide(self, target, addrs)


def _as_rule(rule: str | Rule, action: Action) -> Rule:
    if isinstance(rule, Rule):
        if rule.action != action:
            raise PolicyError(f"rule {rule.text!r} is a {rule.action} rule, not {action}")
        return rule
    return parse_rule(rule, action)


# ---------------------------------------------------------------------------------------
# The decision


def decide(policy: Policy, target: Target, addrs: Sequence[IPAddress] = ()) -> Decision:
    """Decide `target` under `policy`; see the module docstring for the order.

    `addrs` are the addresses the name resolved to (empty before resolution, or for IP
    literals, whose own address is `target.ip`). A result with `needs_addrs` may change once
    the addresses are known, so the caller resolves and decides again; a refusal without it
    is final and the name must not be resolved (docs/policy.md#no-lookup-decides-nothing).
    Allow address rules judge a name's addresses only under the policy's opt-in
    `resolve_names_for_address_rules`.
    """
    route = policy.framework_route(target.host, target.port)
    if route is not None:
        return Decision(True, "framework_route", route.text, f"framework route {route.text}")
    ips: Sequence[IPAddress] = (target.ip,) if target.ip is not None else addrs
    resolved = target.ip is not None or bool(addrs)
    # allow address rules see an address destination, and a name's addresses only by opt-in
    by_address = target.ip is not None or policy.resolve_names_for_address_rules

    block = _first_covering(policy._block.host_matches(target.host), target)
    if block is None:
        block = _first_covering(policy._block.network_matches(ips, every=False), target)
    if block is not None:
        return Decision(False, "block_rule", block.text, f"blocked by rule {block.text!r}")
    pending_block = bool(policy._block.networks) and not resolved

    host_allows = policy._allow.host_matches(target.host)
    allow = _first_covering(host_allows, target)
    if allow is None and by_address:
        allow = _first_covering(policy._allow.network_matches(ips, every=True), target)
    if allow is not None:
        return Decision(
            True, "allow_rule", allow.text, f"allowed by rule {allow.text!r}", pending_block
        )
    if policy.default == "allow":
        return Decision(True, "default_allow", None, "default posture allow", pending_block)
    # a refusal waits for addresses only if an address could turn it into an allow on this
    # scheme and port past the blocks; a block CIDR can only refuse what is refused already
    # (docs/policy.md#no-lookup-decides-nothing)
    pending = not resolved and policy._reach.covers(target.scheme, target.port)
    # some address rule covers every address, so only its port or scheme did not match
    if host_allows or (by_address and policy._allow.network_matches(ips, every=True)):
        names = ", ".join(repr(r.text) for r in host_allows) or "an address rule"
        return Decision(
            False,
            "port_not_allowed",
            None,
            f"{names} does not cover {_describe(target)}",
            pending,
        )
    return Decision(False, "default_deny", None, "no allow rule matches (default deny)", pending)


def _describe(target: Target) -> str:
    how = "CONNECT" if target.scheme == "https" else "plain HTTP"
    return f"{how} to port {target.port}"


def _first_covering(rules: list[Rule], target: Target) -> Rule | None:
    for rule in rules:
        if rule.covers_port(target.scheme, target.port):
            return rule
    return None


# `Rule` and `parse_rule` are `grammar.py`'s, read here too (egress/__init__.py exports them)
__all__ = [
    "Action",
    "Decision",
    "FrameworkRoute",
    "Policy",
    "Posture",
    "Rule",
    "decide",
    "parse_framework_route",
    "parse_rule",
]

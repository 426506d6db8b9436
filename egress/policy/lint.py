"""Policy lint: rules that are legal but almost certainly not what the author meant.

Findings (docs/policy.md#lint): a host pattern that covers a whole public suffix
(`*.com`, `*.co.uk`, `*`),
judged with tldextract's bundled list; a URL rule with a path (paths are ignored, so the rule
is broader than it reads); an allow rule for addresses the address guard refuses whatever the
policy says (`127.0.0.1:8089`: it can never allow anything; a framework service there is a
framework route); the opt-in `resolve_names_for_address_rules` (every name no host rule
allows then costs a lookup of a name the sandbox chooses). Lint never changes a decision or
an exit code.
"""

from __future__ import annotations

from dataclasses import dataclass

from .addrs import AddressGuard
from .psl import is_public_suffix
from .rules import Policy, Rule


@dataclass(frozen=True, slots=True)
class Finding:
    rule: str
    action: str
    message: str

    def __str__(self) -> str:
        if self.action == "policy":  # a policy key, not a rule
            return f"lint: policy key {self.rule!r}: {self.message}"
        return f"lint: {self.action} rule {self.rule!r}: {self.message}"


BY_ADDRESS_KEY = "resolve_names_for_address_rules"


def lint_by_address(policy: Policy) -> Finding | None:
    """The opt-in that lets allow address rules judge names: each name no host rule allows is
    then resolved (a query the sandbox chooses, a channel to the resolver) before its
    refusal (docs/policy.md#no-lookup-decides-nothing)."""
    if not policy.resolve_names_for_address_rules:
        return None
    return Finding(
        BY_ADDRESS_KEY,
        "policy",
        "every name no host rule allows is resolved before it is refused when an address "
        "rule covers its port, so the sandbox chooses DNS queries (a channel to the "
        "resolver); allow the names, or the addresses as destinations "
        "(docs/policy.md#no-lookup-decides-nothing)",
    )


def lint_rule(rule: Rule) -> list[Finding]:
    found: list[Finding] = []
    pat = rule.pattern
    if pat is not None and _covers_public_suffix(pat):
        found.append(Finding(rule.text, rule.action, "covers a whole public suffix"))
    if rule.scheme is not None:
        rest = rule.text.split("://", 1)[1]
        cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=-1)
        if cut >= 0 and rest[cut:] not in ("", "/"):
            found.append(
                Finding(rule.text, rule.action, "URL path is ignored; the rule covers the origin")
            )
    return found


def _covers_public_suffix(pattern: str) -> bool:
    if pattern.strip("*.?") == "":
        return True
    if not pattern.startswith("*"):
        return False
    rest = pattern.lstrip("*").lstrip(".")
    if "*" in rest or "?" in rest:
        return False
    return is_public_suffix(rest)


def lint_guarded(rule: Rule, guard: AddressGuard) -> Finding | None:
    """An allow rule whose every address the guard refuses: it can never allow anything."""
    net = rule.network
    if rule.action != "allow" or net is None:
        return None
    first, last = net.network_address, net.broadcast_address
    why = guard.classify(first)
    if why is None or guard.classify(last) != why:
        return None
    route = f"http://{first if net.version == 4 else f'[{first}]'}"
    if rule.port is not None:
        route += f":{rule.port}"
    hint = f" (framework_routes = [{route!r}])" if net.num_addresses == 1 else ""
    return Finding(
        rule.text,
        rule.action,
        f"the address guard refuses {net} ({why}) whatever the policy says, so this rule "
        f"never allows anything; a framework service there is a framework route{hint} "
        "(docs/policy.md#lint)",
    )


def lint_policy(policy: Policy, guard: AddressGuard | None = None) -> list[Finding]:
    """Every finding: the opt-in first, then allow rules, in definition order; `guard` is the
    address guard the policy runs under (default: the built-in reserved ranges only)."""
    guard = guard or AddressGuard()
    found: list[Finding] = []
    by_address = lint_by_address(policy)
    if by_address is not None:
        found.append(by_address)
    for rule in (*policy.allow_rules, *policy.block_rules):
        found.extend(lint_rule(rule))
        guarded = lint_guarded(rule, guard)
        if guarded is not None:
            found.append(guarded)
    return found

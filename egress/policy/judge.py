"""The whole pure verdict: policy decision, then the address guard.

Two stages, as in smokescreen: the policy judges the canonical name (and address rules the
resolved addresses); the guard then refuses any reserved address the destination is or
resolved to, whatever the policy said — unless the destination is a framework route.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from .addrs import AddressGuard
from .rules import Decision, Policy
from .target import IPAddress, Target


def judge(
    policy: Policy, guard: AddressGuard, target: Target, addrs: Sequence[IPAddress] = ()
) -> Decision:
    """Decide `target` (resolved to `addrs`, if known) under `policy` and `guard`.

    Under a report-only policy a policy refusal becomes an allow carrying `would="block"`
    and the refusal's reason; the guard below still refuses reserved addresses, so report
    mode never opens a path the guard closes (docs/policy.md#report-only-mode).

    A refusal that waits for the name's addresses (`needs_addrs`) stops waiting when every
    allow address rule that could admit them on this port is refused by the guard: then no
    answer could change it, and the name is not resolved
    (docs/policy.md#no-lookup-decides-nothing)."""
    decision = policy.decide(target, addrs)
    if decision.needs_addrs and not decision.allowed:
        if not policy.address_reach(guard).covers(target.scheme, target.port):
            decision = replace(decision, needs_addrs=False)
    if not decision.allowed and policy.report_only:
        decision = Decision(
            True,
            decision.reason,
            decision.rule,
            f"report-only, would block: {decision.detail}",
            target.ip is None and not addrs,
            "block",
        )
    if not decision.allowed or decision.reason == "framework_route":
        return decision
    ips: Sequence[IPAddress] = (target.ip,) if target.ip is not None else addrs
    hit = guard.check(ips, target.port)
    if hit is None:
        return decision
    addr, why = hit
    return Decision(
        False,
        "reserved_address",
        None,
        f"{addr} is a reserved address ({why})",
        decision.needs_addrs,
    )


def judge_name(policy: Policy, name: str, guard: AddressGuard | None = None) -> Decision:
    """May a connection to *some* port of `name` be allowed? Then its DNS lookup is answered
    (docs/proxy.md#transparent-mode-and-socks5).

    Order, as in `policy.decide`: a framework route on the name; a block rule that covers
    every port (a block rule without port or scheme); an allow rule matching the name on any
    port; the default posture; address rules, only under the opt-in
    `resolve_names_for_address_rules` and only if one could admit some address past the blocks
    and `guard` (the name's addresses are not known here, so it is answered and its
    connections are judged by address). Each connection is still judged on its own port. A
    name no rule could allow is refused here, so no connection to it is ever resolved
    (docs/policy.md#no-lookup-decides-nothing).
    """
    for route in policy.framework_routes:
        if route.host == name:
            return Decision(True, "framework_route", route.text, f"framework route {route.text}")
    for rule in policy.host_rules("block", name):
        if rule.port is None and rule.scheme is None:
            return Decision(False, "block_rule", rule.text, f"blocked by rule {rule.text!r}")
    allows = policy.host_rules("allow", name)
    if allows:
        rule = allows[0]
        return Decision(True, "allow_rule", rule.text, f"allowed by rule {rule.text!r}")
    if policy.default == "allow":
        return Decision(True, "default_allow", None, "default posture allow")
    if not policy.address_reach(guard or AddressGuard()).empty:
        return Decision(
            True, "address_rules", None, "address rules may allow it; judged per connection"
        )
    return Decision(False, "default_deny", None, "no allow rule matches (default deny)")

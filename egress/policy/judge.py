"""The whole pure verdict: policy decision, then the address guard.

Two stages, as in smokescreen: the policy judges the canonical name (and address rules the
resolved addresses); the guard then refuses any reserved address the destination is or
resolved to, whatever the policy said — unless the destination is a framework route.
"""

from __future__ import annotations

from collections.abc import Sequence

from .addrs import AddressGuard
from .rules import Decision, Policy
from .target import IPAddress, Target


def judge(
    policy: Policy, guard: AddressGuard, target: Target, addrs: Sequence[IPAddress] = ()
) -> Decision:
    """Decide `target` (resolved to `addrs`, if known) under `policy` and `guard`.

    Under a report-only policy a policy refusal becomes an allow carrying `would="block"`
    and the refusal's reason; the guard below still refuses reserved addresses, so report
    mode never opens a path the guard closes (docs/policy.md#report-only-mode)."""
    decision = policy.decide(target, addrs)
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

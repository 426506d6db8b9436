"""What a policy change takes away: re-judging what is open under the new policy.

Pure. When a client's policy changes (docs/policy.md#live-policy-changes), everything the
old decision let through and that is still open - a tunnel, a plain-HTTP request or response
being relayed, a kept-alive client connection between requests, a pooled upstream
connection - is judged again from its record, with the address it was dialed at, exactly as
a new request to the same destination would be (`policy.judge`). The shell closes what this
refuses and records it `end: revoked` (`tenants.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

from ...errors import TargetError
from ...policy.addrs import AddressGuard
from ...policy.judge import judge
from ...policy.rules import Decision, Policy
from ...policy.target import Scheme, make_target, parse_ip_literal
from .record import AccessRecord

# records no client policy decided: a framework-route forwarder (the route decides) and
# records that never reached a destination
_NOT_POLICY = frozenset({"FORWARD", "-", "SANDBOX", "PROBE", "DNS"})


def revoked_by(
    policies: Mapping[str | None, Policy], guard: AddressGuard, rec: object
) -> Decision | None:
    """The new policy's refusal of what `rec` (the record of something still open) was
    allowed to reach, or None: still allowed, its client's policy did not change, or not a
    policy's decision at all (a forwarder). Judged with the address it was dialed at, so a
    name that now resolves elsewhere does not change the verdict on this connection."""
    if not isinstance(rec, AccessRecord) or not rec.identified or rec.reason is None:
        return None
    if rec.method in _NOT_POLICY or rec.client_id not in policies:
        return None
    try:
        target = make_target(cast(Scheme, rec.scheme), rec.host, rec.port)
    except TargetError:
        return None
    ip = parse_ip_literal(rec.addr) if rec.addr else None
    decision = judge(policies[rec.client_id], guard, target, () if ip is None else (ip,))
    return None if decision.allowed else decision


__all__ = ["revoked_by"]

"""The pure verdict of a policy change on what is open (egress/proxy/core/revocation.py,
docs/policy.md#live-policy-changes): the integration tests (tests/integration/test_revoke*.py)
cut real connections; this pins the verdict's own rules."""

from __future__ import annotations

from egress import Policy
from egress.policy.addrs import AddressGuard, parse_cidr
from egress.proxy.core.record import AccessRecord
from egress.proxy.core.revocation import revoked_by

GUARD = AddressGuard()


def _rec(
    method: str = "GET",
    scheme: str = "http",
    host: str = "a.test",
    port: int = 80,
    addr: str | None = "198.18.0.5",
    client_id: str | None = "sb",
) -> AccessRecord:
    rec = AccessRecord("127.0.0.1:5000", method, scheme, host, port, 0)
    rec.identify(client_id)
    rec.admitted("allow_rule", "a.test")
    rec.addr = addr
    return rec


def test_refused_by_the_new_policy_allowed_or_not_its_client() -> None:
    rec = _rec()
    assert revoked_by({"sb": Policy(allow=["a.test"])}, GUARD, rec) is None
    refused = revoked_by({"sb": Policy(allow=["b.test"])}, GUARD, rec)
    assert refused is not None
    assert refused.reason == "default_deny"
    blocked = revoked_by({"sb": Policy(default="allow", block=["a.test"])}, GUARD, rec)
    assert blocked is not None
    assert (blocked.reason, blocked.rule) == ("block_rule", "a.test")
    assert revoked_by({"other": Policy()}, GUARD, rec) is None  # not its client's change
    assert revoked_by({None: Policy()}, GUARD, _rec(client_id=None)) is not None


def test_judged_with_the_address_it_was_dialed_at() -> None:
    """Address rules (under their opt-in for a name) and the guard see the dialed address,
    not a fresh lookup; without the opt-in an address rule never keeps a name open
    (docs/policy.md#no-lookup-decides-nothing)."""
    rec = _rec()
    inside = Policy(allow=["198.18.0.0/16"], resolve_names_for_address_rules=True)
    outside = Policy(allow=["198.19.0.0/16"], resolve_names_for_address_rules=True)
    assert revoked_by({"sb": inside}, GUARD, rec) is None
    assert revoked_by({"sb": outside}, GUARD, rec) is not None
    assert revoked_by({"sb": Policy(allow=["198.18.0.0/16"])}, GUARD, rec) is not None
    reserved = AddressGuard(extra=(parse_cidr("198.18.0.0/24"),))
    hit = revoked_by({"sb": Policy(allow=["a.test"])}, reserved, rec)
    assert hit is not None
    assert hit.reason == "reserved_address"


def test_what_no_client_policy_decided_is_never_revoked() -> None:
    nothing = Policy()
    assert revoked_by({"sb": nothing}, GUARD, _rec(method="FORWARD", scheme="tcp")) is None
    assert revoked_by({"sb": nothing}, GUARD, _rec(method="-")) is None
    refused = _rec()
    refused.reason = None  # refused before it was admitted: nothing open
    assert revoked_by({"sb": nothing}, GUARD, refused) is None
    assert revoked_by({"sb": nothing}, GUARD, None) is None
    assert revoked_by({"sb": nothing}, GUARD, _rec(host="", port=0)) is None


def test_report_only_keeps_it_open() -> None:
    """A report-only policy lets through what it would block (docs/policy.md)."""
    assert revoked_by({"sb": Policy(report_only=True)}, GUARD, _rec()) is None


def test_the_record_of_a_connection_closed_between_requests() -> None:
    last = _rec(scheme="https", port=443)
    rec = AccessRecord.revoked(last, 0, ("127.0.0.1:3128", "http"), "a kept-alive connection", "h")
    ev = rec.event("block", "default_deny", None, rec.detail)
    assert ev["method"] == "-"
    assert (ev["host"], ev["port"], ev["addr"], ev["client_id"]) == (
        "a.test",
        443,
        "198.18.0.5",
        "sb",
    )
    assert (ev["end"], ev["decision"], ev["reason"], ev["policy"]) == (
        "revoked",
        "block",
        "default_deny",
        "h",
    )
    assert (ev["listener"], ev["mode"]) == ("127.0.0.1:3128", "http")
    assert str(ev["detail"]).startswith("a kept-alive connection closed between requests")

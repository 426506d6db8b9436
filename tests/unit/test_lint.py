"""The policy's lint (egress/policy/lint.py): rules that allow more, or less, than they seem
to, each named with its rule and why (docs/policy.md#lint)."""

from __future__ import annotations

import ipaddress

import pytest

from egress.policy.addrs import AddressGuard
from egress.policy.lint import lint_policy
from egress.policy.rules import Policy

OPT = {"resolve_names_for_address_rules": True}


def findings(policy: Policy, guard: AddressGuard | None = None) -> list[str]:
    return [str(f) for f in lint_policy(policy, guard)]


def test_lint_flags_the_opt_in() -> None:
    found = [str(f) for f in lint_policy(Policy(allow=["198.18.0.0/15"], **OPT))]  # type: ignore[arg-type]
    assert len(found) == 1
    assert found[0].startswith("lint: policy key 'resolve_names_for_address_rules': ")
    assert "docs/policy.md#no-lookup-decides-nothing" in found[0]
    assert lint_policy(Policy(allow=["198.18.0.0/15"])) == []


@pytest.mark.parametrize("rule", ["*.com", "*.co.uk", "*", "*.*", "**.org"])
def test_a_wildcard_over_a_whole_public_suffix_is_flagged(rule: str) -> None:
    assert findings(Policy(allow=[rule])) == [
        f"lint: allow rule {rule!r}: covers a whole public suffix"
    ]


@pytest.mark.parametrize("rule", ["*.example.com", "*.github.io.example", "com", "a*.com"])
def test_a_wildcard_under_a_registrable_name_is_not(rule: str) -> None:
    assert findings(Policy(allow=[rule])) == []


def test_a_url_path_is_flagged_as_ignored_and_a_bare_slash_is_not() -> None:
    assert findings(Policy(allow=["https://x.test/only/this", "https://y.test/"])) == [
        "lint: allow rule 'https://x.test/only/this': URL path is ignored; the rule covers"
        " the origin"
    ]


def test_an_allow_rule_the_guard_always_refuses_never_allows() -> None:
    found = findings(Policy(allow=["127.0.0.1:8080", "198.18.0.0/15"]))
    assert len(found) == 1
    assert found[0].startswith("lint: allow rule '127.0.0.1:8080': the address guard refuses")
    assert "framework_routes = ['http://127.0.0.1:8080']" in found[0]


def test_the_guard_it_runs_under_decides_what_is_refused() -> None:
    """A guard that also reserves 198.18.0.0/15 (`--reserve`) makes a rule inside it one."""
    guard = AddressGuard(extra=(ipaddress.ip_network("198.18.0.0/15"),))
    found = findings(Policy(allow=["198.18.0.0/24"]), guard)
    assert len(found) == 1
    assert "198.18.0.0/24" in found[0]

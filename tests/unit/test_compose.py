"""Evaluator-over-task composition and the Harbor / verifiers mappings."""

import pytest

from egress.errors import PolicyError
from egress.policy.compose import compose, from_harbor, from_verifiers
from egress.policy.rules import Policy
from egress.policy.target import make_target


def allowed(policy: Policy, host: str, port: int = 443, scheme: str = "https") -> bool:
    return policy.decide(make_target(scheme, host, port)).allowed  # type: ignore[arg-type]


EVALUATOR = Policy(
    allow=["pypi.org", "*.pythonhosted.org", "*.github.com"],
    block=["evil.example"],
    default="deny",
    framework_routes=["http://127.0.0.1:8080"],
)

# (id, task policy, host, expected)
CASES = [
    ("evaluator-allow-remains-under-no-network", Policy(default="deny"), "pypi.org", True),
    ("public-task-cannot-widen", Policy(default="allow"), "example.com", False),
    ("task-allow-outside-evaluator-dropped", Policy(allow=["example.com"]), "example.com", False),
    ("task-allow-inside-evaluator-kept", Policy(allow=["api.github.com"]), "api.github.com", True),
    ("task-narrower-wildcard-kept", Policy(allow=["*.api.github.com"]), "x.api.github.com", True),
    ("task-wider-wildcard-dropped", Policy(allow=["*.com"]), "example.com", False),
    ("task-block-applies", Policy(block=["pypi.org"]), "pypi.org", False),
    (
        "evaluator-block-wins-over-task-allow",
        Policy(allow=["evil.example"], default="allow"),
        "evil.example",
        False,
    ),
]


@pytest.mark.parametrize(
    ("task", "host", "want"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_compose_restricted_evaluator(task: Policy, host: str, want: bool) -> None:
    assert allowed(compose(EVALUATOR, task), host) is want


def test_framework_routes_remain() -> None:
    merged = compose(EVALUATOR, Policy(default="deny"))
    assert merged.decide(make_target("http", "127.0.0.1", 8080)).reason == "framework_route"


def test_permissive_evaluator_takes_task_restrictions() -> None:
    evaluator = Policy(default="allow", block=["evil.example"], allow=["pypi.org"])
    task = Policy(default="deny", allow=["example.com"])
    merged = compose(evaluator, task)
    assert merged.default == "deny"
    assert allowed(merged, "example.com")
    assert allowed(merged, "pypi.org")  # the evaluator's allow entries remain
    assert not allowed(merged, "other.com")
    assert not allowed(compose(evaluator, Policy(default="allow")), "evil.example")
    assert allowed(compose(evaluator, Policy(default="allow")), "other.com", 22)


def test_task_port_rule_needs_evaluator_port() -> None:
    assert not allowed(compose(EVALUATOR, Policy(allow=["pypi.org:22"])), "pypi.org", 22)


HARBOR = [
    ("public", {"network_mode": "public"}, "example.com", True),
    ("no-network", {"network_mode": "no-network"}, "example.com", False),
    (
        "allowlist-in",
        {"network_mode": "allowlist", "allowed_hosts": ["example.com"]},
        "example.com",
        True,
    ),
    (
        "allowlist-out",
        {"network_mode": "allowlist", "allowed_hosts": ["example.com"]},
        "other.com",
        False,
    ),
    ("legacy-true", {"allow_internet": True}, "example.com", True),
    ("legacy-false", {"allow_internet": False}, "example.com", False),
    ("unset-is-public", {}, "example.com", True),
]


@pytest.mark.parametrize(
    ("task", "host", "want"), [c[1:] for c in HARBOR], ids=[c[0] for c in HARBOR]
)
def test_harbor_mapping(task: dict[str, object], host: str, want: bool) -> None:
    assert allowed(from_harbor(task), host) is want


def test_harbor_bad_mode() -> None:
    with pytest.raises(PolicyError, match="network_mode"):
        from_harbor({"network_mode": "sometimes"})


VERIFIERS = [
    ("no-access", {"network_access": False}, "example.com", False),
    ("no-access-allow", {"network_access": False, "allow": ["example.com"]}, "example.com", True),
    ("access", {"network_access": True}, "example.com", True),
    ("access-block", {"network_access": True, "block": ["example.com"]}, "example.com", False),
]


@pytest.mark.parametrize(
    ("settings", "host", "want"), [c[1:] for c in VERIFIERS], ids=[c[0] for c in VERIFIERS]
)
def test_verifiers_mapping(settings: dict[str, object], host: str, want: bool) -> None:
    assert allowed(from_verifiers(settings), host) is want

"""Policy composition (evaluator over task) and mappings from peer frameworks' settings.

Pure. An evaluation has two policy authors: the *evaluator* (the framework operator, who knows
which infrastructure must stay reachable and what must never be) and the *task* (which says
how much network the task needs). `compose(evaluator, task)` obeys four rules:

 1. Blocks compose: every block rule of either side applies, and block still beats allow.
 2. The posture is the stricter one: `deny` if either side says `deny`.
 3. A task never widens a restricted evaluator: under an evaluator with `default = "deny"`,
    a task allow rule survives only if the evaluator itself would allow the rule's own
    host pattern on the rule's ports (a literal or a narrower wildcard of an evaluator rule).
 4. The evaluator's allow entries and framework routes remain, whatever the task says.

Mappings: Harbor's task `network_mode` (`public` | `no-network` | `allowlist` with
`allowed_hosts`; legacy `allow_internet: bool`) and verifiers-style
`network_access` / `allow` / `block`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

from ..errors import PolicyError
from ..validate import as_bool, as_instance, as_str_list
from .rules import FrameworkRoute, Policy, Posture, Rule
from .target import DEFAULT_PORTS, Scheme, make_target

T = TypeVar("T")


def compose(evaluator: Policy, task: Policy) -> Policy:
    """The policy an agent runs under: see the module docstring for the rules."""
    as_instance(evaluator, "compose evaluator", Policy, "a Policy")
    as_instance(task, "compose task", Policy, "a Policy")
    default: Posture = (
        "allow" if evaluator.default == "allow" and task.default == "allow" else "deny"
    )
    if evaluator.default == "deny":
        task_allows = [r for r in task.allow_rules if _evaluator_covers(evaluator, r)]
    else:
        task_allows = list(task.allow_rules)
    return Policy(
        allow=_unique([*evaluator.allow_rules, *task_allows]),
        block=_unique([*evaluator.block_rules, *task.block_rules]),
        default=default,
        framework_routes=_unique_routes([*evaluator.framework_routes, *task.framework_routes]),
    )


def _unique(rules: Iterable[Rule]) -> list[Rule]:
    seen: dict[tuple[str, str], Rule] = {}
    for rule in rules:
        seen.setdefault((rule.action, rule.text), rule)
    return list(seen.values())


def _unique_routes(routes: Iterable[FrameworkRoute]) -> list[FrameworkRoute]:
    return list(dict.fromkeys(routes))


def _evaluator_covers(evaluator: Policy, rule: Rule) -> bool:
    """Would `evaluator` allow everything `rule` allows? (Conservative: may say no.)"""
    for scheme, port in _rule_ports(rule):
        if rule.network is not None:
            net = rule.network
            if net.num_addresses != 1:
                return any(
                    r.network is not None
                    and net.subnet_of(r.network)  # type: ignore[arg-type]
                    and r.covers_port(scheme, port)
                    for r in evaluator.allow_rules
                )
            target = make_target(scheme, str(net.network_address), port)
            if not evaluator.decide(target).allowed:
                return False
            continue
        assert rule.pattern is not None
        if "*" in rule.pattern or "?" in rule.pattern:
            # the pattern text itself, judged as a name, must fall under an evaluator rule
            hits = evaluator._allow.host_matches(rule.pattern)
            if not any(r.covers_port(scheme, port) for r in hits):
                return False
            continue
        if not evaluator.decide(make_target(scheme, rule.pattern, port)).allowed:
            return False
    return True


def _rule_ports(rule: Rule) -> list[tuple[Scheme, int]]:
    if rule.scheme is not None and rule.port is not None:
        return [(rule.scheme, rule.port)]
    if rule.port is not None:
        return [("https", rule.port), ("http", rule.port)]
    return [("https", DEFAULT_PORTS["https"]), ("http", DEFAULT_PORTS["http"])]


# --- mappings from peer frameworks ------------------------------------------------------------


def from_harbor(task: Mapping[str, object]) -> Policy:
    """Harbor's task network settings as a `Policy`.

    `network_mode`: `public` (default allow), `no-network` (deny, nothing allowed),
    `allowlist` (deny plus `allowed_hosts`). Legacy `allow_internet: true|false` maps to
    `public` / `no-network`. Raises `PolicyError` for an unknown mode or a bad host.
    """
    mode = task.get("network_mode")
    if mode is None and "allow_internet" in task:
        # the string "false" must not read as true (docs/policy.md#types)
        allowed = _checked(as_bool, task["allow_internet"], "harbor task: allow_internet")
        mode = "public" if allowed else "no-network"
    if mode is None:
        mode = "public"  # Harbor's default when a task says nothing
    hosts = _checked(as_str_list, task.get("allowed_hosts", []) or [], "harbor task: allowed_hosts")
    if mode == "public":
        return Policy(default="allow")
    if mode == "no-network":
        return Policy(default="deny")
    if mode == "allowlist":
        return Policy(allow=hosts, default="deny")
    raise PolicyError(
        f"harbor task: network_mode {mode!r} is not one of public, no-network, allowlist"
    )


def from_verifiers(settings: Mapping[str, object]) -> Policy:
    """verifiers-style `network_access` / `allow` / `block` as a `Policy`.

    `network_access = false` is `default = "deny"` (allow entries still apply);
    `network_access = true` is `default = "allow"` with the block rules.
    """
    access = _checked(
        as_bool, settings.get("network_access", False), "verifiers settings: network_access"
    )
    allow = _checked(as_str_list, settings.get("allow", []) or [], "verifiers settings: allow")
    block = _checked(as_str_list, settings.get("block", []) or [], "verifiers settings: block")
    return Policy(allow=allow, block=block, default="allow" if access else "deny")


def _checked(check: Callable[[object, str], T], value: object, field: str) -> T:
    """Run one of `validate`'s checks, reporting a failure as a `PolicyError` (the mappings'
    documented error) that names the field."""
    try:
        return check(value, field)
    except (TypeError, ValueError) as exc:
        raise PolicyError(str(exc)) from None

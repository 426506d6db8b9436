"""Policy lint: rules that are legal but almost certainly not what the author meant.

Findings (docs/policy.md#lint): a host pattern that covers a whole public suffix
(`*.com`, `*.co.uk`, `*`),
judged with tldextract's bundled list; a URL rule with a path (paths are ignored, so the rule
is broader than it reads). Lint never changes a decision or an exit code.
"""

from __future__ import annotations

from dataclasses import dataclass

from .psl import is_public_suffix
from .rules import Policy, Rule


@dataclass(frozen=True, slots=True)
class Finding:
    rule: str
    action: str
    message: str

    def __str__(self) -> str:
        return f"lint: {self.action} rule {self.rule!r}: {self.message}"


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


def lint_policy(policy: Policy) -> list[Finding]:
    """Every finding, allow rules first, in definition order."""
    found: list[Finding] = []
    for rule in (*policy.allow_rules, *policy.block_rules):
        found.extend(lint_rule(rule))
    return found

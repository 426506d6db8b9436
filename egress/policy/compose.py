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
 5. The mode is the stricter one: report-only only when both sides are report-only.

Mappings: Harbor 0.26's `NetworkPolicy` (`public` | `no-network` | `allowlist` with
`allowed_hosts`, any port) and verifiers 0.4's `NetworkPolicyConfig` (`verifiers.py`).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

from ..errors import PolicyError, TargetError
from ..validate import as_instance
from .rules import FrameworkRoute, Policy, Posture, Rule, parse_rule
from .target import DEFAULT_PORTS, Scheme, make_target, normalize_host
from .verifiers import from_verifiers as from_verifiers

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
        report_only=evaluator.report_only and task.report_only,
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
    if rule.any_port:
        return _evaluator_covers_any_port(evaluator, rule)
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
            # every name the pattern matches must fall under one evaluator rule's pattern
            hits = _covering_patterns(evaluator, rule.pattern)
            if not any(r.covers_port(scheme, port) for r in hits):
                return False
            continue
        if not evaluator.decide(make_target(scheme, rule.pattern, port)).allowed:
            return False
    return True


def _evaluator_covers_any_port(evaluator: Policy, rule: Rule) -> bool:
    """An any-port rule (`host:*`) is covered only by an evaluator any-port rule whose host
    pattern or network contains the rule's own."""
    if rule.network is not None:
        return any(
            r.any_port and r.network is not None and rule.network.subnet_of(r.network)  # type: ignore[arg-type]
            for r in evaluator.allow_rules
            if r.network is not None and r.network.version == rule.network.version
        )
    assert rule.pattern is not None
    if "*" not in rule.pattern and "?" not in rule.pattern:
        return any(r.any_port for r in evaluator.host_rules("allow", rule.pattern))
    return any(r.any_port for r in _covering_patterns(evaluator, rule.pattern))


def _covering_patterns(evaluator: Policy, pattern: str) -> list[Rule]:
    """The evaluator's host-pattern allow rules that match every name `pattern` matches.

    Decided on the patterns as sets of names, never by matching one pattern's text as a name:
    `api-?.example.com` matches the text `api-*.example.com`, but not `api-x.evil.example.com`,
    which that pattern matches (docs/policy.md, composition)."""
    return [
        r
        for r in evaluator.allow_rules
        if r.pattern is not None and pattern_within(pattern, r.pattern)
    ]


def pattern_within(inner: str, outer: str) -> bool:
    """Does host pattern `outer` match every name `inner` matches? Both in our syntax (fnmatch
    `*` and `?`; a leading `*.` also matches the apex). Sound, not complete: a yes is a proof,
    a no may miss a containment (e.g. `*?` within `?*`), which only drops a task rule."""
    return all(any(_glob_within(i, o) for o in _languages(outer)) for i in _languages(inner))


def _languages(pattern: str) -> list[str]:
    """`pattern` as plain fnmatch globs whose union it matches."""
    return [pattern, pattern[2:]] if pattern.startswith("*.") else [pattern]


def _glob_within(inner: str, outer: str) -> bool:
    """Glob containment proven symbol by symbol: an `outer` literal takes only the same
    `inner` literal, an `outer` `?` one `inner` literal or `?`, an `outer` `*` any run of
    `inner` symbols; an `inner` `*` only an `outer` `*`. O(len(inner) * len(outer))."""
    # reach[i]: inner[i:] can still be matched against the rest of outer
    reach = [i == 0 for i in range(len(inner) + 1)]
    for o in outer:
        if o == "*":
            for i in range(1, len(inner) + 1):
                reach[i] = reach[i] or reach[i - 1]
            continue
        nxt = [False] * (len(inner) + 1)
        for i in range(len(inner)):
            c = inner[i]
            if reach[i] and c != "*" and (o == c or (o == "?" and c != "*")):
                nxt[i + 1] = True
        reach = nxt
    return reach[len(inner)]


def _rule_ports(rule: Rule) -> list[tuple[Scheme, int]]:
    if rule.scheme is not None and rule.port is not None:
        return [(rule.scheme, rule.port)]
    if rule.port is not None:
        return [("https", rule.port), ("http", rule.port)]
    return [("https", DEFAULT_PORTS["https"]), ("http", DEFAULT_PORTS["http"])]


# --- mappings from peer frameworks ------------------------------------------------------------


def from_harbor(policy: object) -> Policy:
    """Harbor 0.26's `NetworkPolicy` (or its `model_dump()` dict) as a `Policy`.

    Decides as Harbor's own enforcement does (docs/integrations.md#harbor):

    - `public` (also: nothing set): `default = "allow"`;
    - `no-network`: `default = "deny"` and no rules, so only the framework routes that
      `prepare_execution` adds stay reachable;
    - `allowlist`: `default = "deny"` plus one any-port rule per `allowed_hosts` entry
      (Harbor's sidecar redirects every TCP port): `host:*`, `?*.suffix:*` for Harbor's
      `*.suffix` (subdomains, never the apex), `ADDR:*` and `CIDR:*`.

    Entries are validated and normalized exactly as Harbor's task config does (stripped,
    lowercased, trailing dots removed, CIDRs strict). Raises `PolicyError` for what Harbor
    refuses (an unknown mode, `allowed_hosts` outside `allowlist`, a bad entry), for any key
    other than `network_mode` and `allowed_hosts`, and for a legal entry this rule language
    cannot express exactly (it never approximates): a name our host syntax reads as an
    address (`1.2.3`), one with a numeric last label, an invalid IDNA A-label, an
    IPv4-mapped IPv6 address or network.
    """
    fields = _harbor_fields(policy)
    unknown = sorted(set(fields) - {"network_mode", "allowed_hosts"})
    if unknown:
        raise PolicyError(
            f"harbor network policy: unknown key(s) {', '.join(map(repr, unknown))} "
            "(a NetworkPolicy has network_mode and allowed_hosts)"
        )
    mode = fields.get("network_mode", "public")
    mode = getattr(mode, "value", mode)  # harbor's NetworkMode is a str enum
    if mode not in ("public", "no-network", "allowlist"):
        raise PolicyError(
            f"harbor network policy: network_mode {mode!r} is not one of public, "
            "no-network, allowlist"
        )
    raw_hosts = fields.get("allowed_hosts", [])
    if not isinstance(raw_hosts, list | tuple) or not all(isinstance(h, str) for h in raw_hosts):
        raise PolicyError("harbor network policy: allowed_hosts must be a list of strings")
    hosts = harbor_allowed_hosts(list(raw_hosts))
    if hosts and mode != "allowlist":
        raise PolicyError(
            "harbor network policy: allowed_hosts is only valid when network_mode='allowlist'"
        )
    if mode == "public":
        return Policy(default="allow")
    return Policy(allow=[_harbor_rule(h) for h in dict.fromkeys(hosts)], default="deny")


def _harbor_fields(policy: object) -> dict[str, object]:
    dump = getattr(policy, "model_dump", None)
    if callable(dump) and not isinstance(policy, Mapping):
        policy = dump()
    if not isinstance(policy, Mapping):
        raise PolicyError(
            f"harbor network policy: expected a NetworkPolicy or a dict, not "
            f"{type(policy).__name__}"
        )
    if not all(isinstance(k, str) for k in policy):
        raise PolicyError("harbor network policy: keys must be strings")
    return dict(policy)


_HARBOR_LABEL = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
_NUMERIC_LABEL = re.compile(r"0x[0-9a-f]*|[0-9]+")  # a label inet_aton reads as a number
_OCTET = re.compile(r"0|[1-9][0-9]{0,2}")  # a part of a canonical dotted quad
_HARBOR_BAD = (
    "harbor allowed_hosts entry {!r}: entries must be hostnames, IP addresses, or IP CIDR "
    "ranges, not URLs, ports, or paths"
)


def harbor_allowed_hosts(hosts: list[str]) -> list[str]:
    """Harbor's own validation and normalization of `allowed_hosts` (its task config's
    `normalize_allowed_hosts`, step by step), raising `PolicyError` where Harbor raises."""
    return [_harbor_entry(host) for host in hosts]


def _harbor_entry(raw: str) -> str:
    host = raw.strip().lower().rstrip(".")
    if not host:
        raise PolicyError("harbor allowed_hosts: entries must be non-empty hostnames")
    if "/" in host or ":" in host:
        if "%" in host:
            raise PolicyError(_HARBOR_BAD.format(raw))
        try:
            if "/" in host:
                return ipaddress.ip_network(host, strict=True).compressed
            address = ipaddress.ip_address(host)
        except ValueError:
            raise PolicyError(_HARBOR_BAD.format(raw)) from None
        if address.version != 6:
            raise PolicyError(_HARBOR_BAD.format(raw))
        return address.compressed
    if "[" in host or "]" in host:
        raise PolicyError(_HARBOR_BAD.format(raw))
    name = host
    if host.startswith("*."):
        name = host[2:]
        if not name:
            raise PolicyError(f"harbor allowed_hosts entry {raw!r}: a wildcard needs a suffix")
        if _ip_or_none(name) is not None:
            raise PolicyError(
                f"harbor allowed_hosts entry {raw!r}: wildcards must target hostnames, "
                "not IP address literals"
            )
    elif "*" in host:
        raise PolicyError(
            f"harbor allowed_hosts entry {raw!r}: wildcards must use a leading '*.' prefix"
        )
    if not all(_HARBOR_LABEL.match(label) for label in name.split(".")):
        raise PolicyError(
            f"harbor allowed_hosts entry {raw!r}: not an IP address, CIDR range, hostname "
            "or leading-wildcard pattern of letters, digits, hyphens and dots"
        )
    return host


def _ip_or_none(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _harbor_rule(entry: str) -> str:
    """One normalized Harbor entry as an any-port rule, or `PolicyError` when no rule means
    exactly what Harbor's sidecar matches (docs/integrations.md#harbor).

    An address or CIDR entry admits address destinations only (a name that resolves into it
    is judged by its name, as Harbor's sidecar judges the name it sniffs): the mapped policy
    never sets `resolve_names_for_address_rules`."""
    if "/" in entry:
        net = ipaddress.ip_network(entry)
        if isinstance(net, ipaddress.IPv6Network) and net.network_address.ipv4_mapped:
            raise _inexpressible(entry, "an IPv4-mapped IPv6 network (write it as IPv4)")
        return f"{entry}:*"
    address = _ip_or_none(entry)
    if address is not None:
        if isinstance(address, ipaddress.IPv6Address):
            if address.ipv4_mapped is not None:
                # the sidecar matches it as written, never an IPv4 destination
                raise _inexpressible(entry, "an IPv4-mapped IPv6 address (write it as IPv4)")
            return f"[{entry}]:*"
        return f"{entry}:*"
    if entry.startswith("*."):
        # `?*.` is one or more characters and a dot: Harbor's `*.` never matches the apex.
        # Matched on the spelling, as Harbor's sidecar does, so `*.0.0.1` matches the
        # address 10.0.0.1 in its dotted spelling; a numeric last label in any other
        # spelling (`*.1.0x1`, `*.1.2.3.4`) names nothing egress accepts.
        rule = f"?*.{entry[2:]}:*"
        suffix = entry[2:].split(".")
        if _NUMERIC_LABEL.fullmatch(suffix[-1]) and not (
            len(suffix) <= 3 and all(_OCTET.fullmatch(p) and int(p) <= 255 for p in suffix)
        ):
            raise _inexpressible(entry, "it can match no host name or address egress accepts")
        try:
            parse_rule(rule, "allow")
        except PolicyError as exc:
            raise _inexpressible(entry, str(exc)) from None
        return rule
    try:
        canonical = normalize_host(entry)
    except TargetError as exc:
        raise _inexpressible(entry, str(exc)) from None
    if canonical != entry:
        raise _inexpressible(entry, f"this host syntax reads it as {canonical!r}")
    return f"{entry}:*"


def _inexpressible(entry: str, why: str) -> PolicyError:
    return PolicyError(
        f"harbor allowed_hosts entry {entry!r} cannot be expressed exactly: {why} "
        "(docs/integrations.md#harbor)"
    )


def _checked(check: Callable[[object, str], T], value: object, field: str) -> T:
    """Run one of `validate`'s checks, reporting a failure as a `PolicyError` (the mappings'
    documented error) that names the field."""
    try:
        return check(value, field)
    except (TypeError, ValueError) as exc:
        raise PolicyError(str(exc)) from None

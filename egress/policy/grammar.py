"""One rule's grammar: the four forms of rule text (host pattern, URL origin, address, CIDR;
each with a port, `:*` or neither) parsed into a `Rule` (docs/policy.md#rule-forms).

Pure. Its own module because the rule is what the policy (`rules.py`), its indexes
(`index.py`) and its reach (`reach.py`) all read, and none of them may import another that
imports it back.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, replace
from typing import Literal

from ..errors import PolicyError, TargetError
from .target import (
    DEFAULT_PORTS,
    IPNetwork,
    Scheme,
    normalize_host,
    normalize_label,
    parse_ip_literal,
    split_host_port,
)

Action = Literal["allow", "block"]

_PATTERN_CHARS = re.compile(r"[a-z0-9_.*?-]+")


@dataclass(frozen=True, slots=True)
class Rule:
    """One parsed rule. `text` is the rule as written (what audit lines and errors quote)."""

    text: str
    action: Action
    pattern: str | None = None  # canonical host pattern (host and URL forms)
    network: IPNetwork | None = None  # IP literal / CIDR form
    port: int | None = None
    scheme: Scheme | None = None
    any_port: bool = False  # the `:*` form (docs/policy.md#ports-and-schemes)

    def covers_port(self, scheme: Scheme, port: int) -> bool:
        """Does this rule speak about (scheme, port)? See the module docstring."""
        if self.any_port:
            return True
        if self.scheme is not None:
            return scheme == self.scheme and port == self.port
        if self.port is not None:
            return port == self.port
        if self.action == "block":
            return True
        return port == DEFAULT_PORTS[scheme]

    def __repr__(self) -> str:
        return f"Rule({self.action} {self.text!r})"


def parse_rule(text: str, action: Action) -> Rule:
    """Parse one rule in any of the four forms; raise `PolicyError` quoting it."""
    raw = text.strip()
    if not raw:
        raise PolicyError(f"{action} rule {text!r}: empty rule")
    if raw.endswith(":*") and "://" not in raw:
        # any port: no host, address or CIDR spelling ends in ":*", so the suffix is
        # unambiguous; what precedes it is parsed as a rule without a port
        rule = parse_rule(raw[:-2], action)
        if rule.port is not None or rule.any_port:
            raise PolicyError(f"{action} rule {raw!r}: a port and ':*' together")
        return replace(rule, text=raw, any_port=True)
    try:
        if "://" in raw:
            return _parse_url_rule(raw, action)
        if "/" in raw:
            return _parse_cidr_rule(raw, action)
        return _parse_host_rule(raw, action)
    except PolicyError as exc:
        raise PolicyError(f"{action} {exc}{_hint(raw)}") from None
    except (TargetError, ValueError) as exc:
        raise PolicyError(f"{action} rule {raw!r}: {exc}{_hint(raw)}") from None


def _hint(raw: str) -> str:
    """What a rule that does not parse was most likely meant to be (docs/policy.md#rule-forms):
    a host with a path, a CIDR with a port, a leading-dot domain, a CIDR with host bits."""
    if "://" in raw:
        return ""
    head, _, tail = raw.partition("/")
    if "/" in raw and parse_ip_literal(head.strip("[]")) is None:
        return f"; rules match hosts, not paths: did you mean {head!r} or 'https://{head}'?"
    if "/" in raw and ":" in tail:
        cidr = f"{head}/{tail.split(':', 1)[0]}"
        return (
            f"; a CIDR rule takes no port: did you mean {cidr!r} (ports 80 and 443) "
            f"or '{cidr}:*' (every port)?"
        )
    if "/" in raw:
        try:
            network = ipaddress.ip_network(raw.replace("[", "").replace("]", ""), strict=False)
        except ValueError:
            return ""
        return f"; did you mean {str(network)!r}?"
    if raw.startswith(".") and len(raw) > 1:
        rest = raw.lstrip(".")
        return f"; did you mean '*.{rest}' (it and its subdomains) or {rest!r}?"
    return ""


def _parse_url_rule(raw: str, action: Action) -> Rule:
    scheme, _, rest = raw.partition("://")
    scheme = scheme.lower()
    if scheme not in ("http", "https"):
        raise PolicyError(f"rule {raw!r}: scheme must be http or https")
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    if "@" in authority:
        raise PolicyError(f"rule {raw!r}: userinfo is not allowed in a rule")
    host, port_text = split_host_port(authority)
    port = _rule_port(port_text, raw) if port_text else DEFAULT_PORTS[scheme]
    ip = parse_ip_literal(host)
    s: Scheme = "https" if scheme == "https" else "http"
    if ip is not None:
        return Rule(raw, action, network=ipaddress.ip_network(ip), port=port, scheme=s)
    return Rule(raw, action, pattern=_normalize_pattern(host, raw), port=port, scheme=s)


def _parse_cidr_rule(raw: str, action: Action) -> Rule:
    text = raw
    if text.startswith("[") and "]" in text:
        text = text.replace("[", "").replace("]", "")
    try:
        network = ipaddress.ip_network(text, strict=True)
    except ValueError as exc:
        raise PolicyError(f"rule {raw!r}: not a valid CIDR ({exc})") from None
    if isinstance(network, ipaddress.IPv6Network) and network.network_address.ipv4_mapped:
        mapped = network.network_address.ipv4_mapped
        prefix = max(network.prefixlen - 96, 0)
        network = ipaddress.ip_network(f"{mapped}/{prefix}", strict=False)
    return Rule(raw, action, network=network)


def _parse_host_rule(raw: str, action: Action) -> Rule:
    if raw.startswith("["):
        host, port_text = split_host_port(raw)
    elif raw.count(":") > 1:
        host, port_text = raw, None  # a bare IPv6 literal
    else:
        host, port_text = split_host_port(raw)
    port = _rule_port(port_text, raw) if port_text is not None else None
    ip = parse_ip_literal(host)
    if ip is not None:
        return Rule(raw, action, network=ipaddress.ip_network(ip), port=port)
    return Rule(raw, action, pattern=_normalize_pattern(host, raw), port=port)


def _rule_port(text: str, raw: str) -> int:
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= 65535:
        raise PolicyError(f"rule {raw!r}: invalid port {text!r} (must be 1-65535)")
    return int(text)


def _normalize_pattern(host: str, raw: str) -> str:
    """Canonicalize a host pattern with the same rules as a destination host."""
    if "[" in host or "]" in host:
        raise PolicyError(f"rule {raw!r}: '[' is not allowed in a host pattern (use IP form)")
    if "*" not in host and "?" not in host:
        return normalize_host(host)
    pattern = host[:-1] if host.endswith(".") else host
    labels = []
    for label in pattern.split("."):
        if not label:
            raise PolicyError(f"rule {raw!r}: empty label in host pattern")
        if "*" in label or "?" in label:
            lowered = label.lower()
            if not _PATTERN_CHARS.fullmatch(lowered):
                raise PolicyError(f"rule {raw!r}: invalid character in host pattern")
            labels.append(lowered)
        else:
            labels.append(normalize_label(label, raw))
    return ".".join(labels)


__all__ = ["Action", "Rule", "parse_rule"]

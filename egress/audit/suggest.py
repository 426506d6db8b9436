"""`egress audit suggest`: the smallest policy that allows what an audit log shows.

Strategy (docs/audit-log.md#egress-audit-suggest): feed request records (typically from a
report-only run, docs/policy.md#report-only-mode); each destination that was allowed, or
would have been blocked only for want of an allow rule, becomes one *exact* rule — no
wildcard, no widening — grouped by registrable domain with its record count. Destinations
refused by the address guard, by a block rule or by the SNI check are never allowed: they are
listed as comments, so a reviewer sees them. The text is TOML that `--policy` loads as is.

Pure: records in, text out; the registrable-domain function and the linter are passed in.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from egress.printable import printable

# reasons whose records are callouts, never rules
GUARD_REASONS = frozenset({"reserved_address"})
SNI_REASONS = frozenset({"sni_mismatch", "sni_missing"})
# errors after the policy let the request through: the destination was wanted
AFTER_DECISION_ERRORS = frozenset({"connection_refused", "connection_timeout", "upstream_error"})
# refusals that an allow rule would have turned into an allow
WANTS_RULE = frozenset({"default_deny", "port_not_allowed"})


@dataclass
class _Seen:
    count: int = 0
    would: int = 0  # records that report mode let through but enforce mode would refuse
    errors: int = 0
    notes: set[str] = field(default_factory=set)


@dataclass
class Suggestion:
    """What the records showed, sorted into rules and callouts."""

    records: int = 0
    clients: set[str] = field(default_factory=set)
    allowed: dict[str, _Seen] = field(default_factory=dict)  # rule text -> counts
    hosts: dict[str, str] = field(default_factory=dict)  # rule text -> host
    reserved: dict[str, _Seen] = field(default_factory=dict)  # host:port -> counts
    blocked: dict[str, _Seen] = field(default_factory=dict)  # host:port -> counts, rule
    sni: dict[str, _Seen] = field(default_factory=dict)
    refused: dict[str, _Seen] = field(default_factory=dict)  # enforce-mode default denials
    failed: dict[str, _Seen] = field(default_factory=dict)  # errors before any verdict
    routes: int = 0
    # no destination (no host or port: refused before a request was read, a malformed
    # target): counted in `records`, listed by reason, never a rule
    nowhere: dict[str, _Seen] = field(default_factory=dict)
    lifecycle: int = 0  # sandbox lifecycle records: no requests, left out

    def add(self, record: dict[str, object]) -> None:
        host = str(record.get("host") or "")
        port = record.get("port")
        scheme = str(record.get("scheme") or "")
        reason = str(record.get("reason") or "")
        decision = str(record.get("decision") or "")
        self.records += 1
        if record.get("client_id"):
            self.clients.add(str(record["client_id"]))
        if not host or not isinstance(port, int) or port <= 0:
            _bump(self.nowhere, reason or "(no reason)", f"{record.get('method')} {host}".strip())
            return
        where = f"{_bracket(host)}:{port}"
        would = record.get("would") == "block"
        # report-only: the policy's verdict, also when the request failed after it
        # (`would_reason`, docs/audit-log.md#report-only-fields)
        verdict = str(record.get("would_reason") or reason) if would else reason
        if reason == "framework_route" or record.get("method") == "FORWARD":
            self.routes += 1
        elif verdict in GUARD_REASONS:
            _bump(self.reserved, where, str(record.get("detail") or ""))
        elif verdict == "block_rule":
            _bump(self.blocked, where, f"rule {record.get('rule')!r}")
        elif verdict in SNI_REASONS:
            _bump(self.sni, where, str(record.get("detail") or reason))
        elif decision == "allow" or reason in AFTER_DECISION_ERRORS or would:
            rule = exact_rule(scheme, host, port)
            seen = _bump(self.allowed, rule)
            self.hosts[rule] = host
            seen.would += would
            seen.errors += decision == "error"
        elif decision == "block" and reason in WANTS_RULE:
            _bump(self.refused, f"{scheme} {where}", reason)
        else:  # an error before any verdict could be used (a name that did not resolve)
            _bump(self.failed, where, reason)


def _bump(table: dict[str, _Seen], key: str, note: str = "") -> _Seen:
    seen = table.setdefault(key, _Seen())
    seen.count += 1
    if note and len(seen.notes) < 3:
        seen.notes.add(note)
    return seen


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def exact_rule(scheme: str, host: str, port: int) -> str:
    """The narrowest rule covering one observed destination (docs/policy.md#ports-and-schemes).

    CONNECT to 443 -> `https://host` (CONNECT 443 only); plain HTTP to 80 -> `http://host`;
    plain HTTP elsewhere -> `http://host:port`; CONNECT elsewhere -> `host:port` (an
    `https://host:port` rule would add the TLS SNI check to a port that may not carry TLS).
    """
    shown = _bracket(host)
    if scheme == "https":
        return f"https://{shown}" if port == 443 else f"{shown}:{port}"
    return f"http://{shown}" if port == 80 else f"http://{shown}:{port}"


def suggest(records: Iterable[dict[str, object]]) -> Suggestion:
    out = Suggestion()
    for record in records:
        out.add(record)
    return out


def render(
    s: Suggestion,
    domain_of: Callable[[str], str],
    lint: Callable[[list[str]], list[str]],
    sources: list[str],
) -> str:
    """The suggestion as TOML with comments (loadable by `--policy`)."""
    lines = [
        printable("# Suggested by `egress audit suggest` from " + ", ".join(sources)),
        printable(
            f"# {s.records} request records"
            + (f" of clients {', '.join(sorted(s.clients))}" if s.clients else "")
            + ". Every allow rule below is exactly one observed destination (no wildcards)."
        ),
        "# Review it: traffic seen during observation is not necessarily traffic to allow.",
        'default = "deny"',
        "allow = [",
    ]
    groups: dict[str, list[str]] = {}
    for rule in s.allowed:
        groups.setdefault(domain_of(s.hosts[rule]), []).append(rule)
    for domain in sorted(groups, key=lambda d: (-sum(s.allowed[r].count for r in groups[d]), d)):
        total = sum(s.allowed[r].count for r in groups[domain])
        lines.append(printable(f"    # {domain}: {total} record(s)"))
        for rule in sorted(groups[domain]):
            seen = s.allowed[rule]
            extra = []
            if seen.would:
                extra.append(f"{seen.would} would have been blocked")
            if seen.errors:
                extra.append(f"{seen.errors} failed after the decision")
            note = f" ({'; '.join(extra)})" if extra else ""
            lines.append(f"    {_toml_str(rule)},  # {seen.count}{note}")
    lines.append("]")
    lines += _callouts(s)
    findings = lint(list(s.allowed))
    if findings:
        lines += ["", "# lint:"] + [printable(f"#   {f}") for f in findings]
    return "\n".join(lines) + "\n"


def _callouts(s: Suggestion) -> list[str]:
    out: list[str] = []
    sections = (
        (
            s.reserved,
            "reserved addresses: the address guard refuses these whatever the "
            "policy says; not allowed",
        ),
        (s.blocked, "refused by a block rule; not allowed (keep the block rule)"),
        (s.sni, "refused by the TLS SNI check; not allowed"),
        (
            s.refused,
            "refused for want of an allow rule in an enforcing run; not allowed "
            "(add them by hand if wanted)",
        ),
        (s.failed, "failed before the policy's verdict was used (not allowed)"),
        (
            s.nowhere,
            "no destination (refused before a request was read, or a malformed target), "
            "by reason; not allowed",
        ),
    )
    for table, title in sections:
        if not table:
            continue
        out += ["", f"# {title}:"]
        for where in sorted(table):
            seen = table[where]
            notes = "; ".join(sorted(seen.notes))
            # a comment is one line: text from the log never ends it (egress/printable.py)
            line = f"#   {where}  {seen.count} record(s)" + (f"  {notes}" if notes else "")
            out.append(printable(line))
    if s.routes:
        out += [
            "",
            f"# {s.routes} framework-route record(s): covered by framework_routes, not by rules",
        ]
    if s.lifecycle:
        out += ["", f"# {s.lifecycle} sandbox lifecycle record(s): not requests, left out"]
    return out


def _toml_str(text: str) -> str:
    """A TOML basic string: JSON's escapes are TOML's (`\\n`, `\\uXXXX`), except that TOML
    wants DEL escaped too, and has no escape for a lone surrogate (shown as U+FFFD): a
    hostile log's host never breaks the file."""
    text = "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in text)
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


__all__ = ["Suggestion", "exact_rule", "render", "suggest"]

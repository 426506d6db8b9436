"""What `egress audit report` keeps of a log in one streaming pass: `ReportData`
(docs/audit-log.md#egress-audit-report).

Strategy: memory is bounded by distinct values, never by lines (as `summarize`): the `Summary`
tables, the records by kind (plain-HTTP requests, tunnels, DNS queries, no destination) and
decision, per host reached (allowed) its requests, tunnels, ports and bytes, per client its
kinds, decisions, bytes and the hosts it reached (`MAX_CLIENT_HOSTS` each), per blocked host
its reasons and rules, per error reason and destination its count and first detail
(`MAX_ERRORS` of them), per client (execution or sandbox) its decisions per minute, the policy
records (up to `MAX_POLICIES`), the lifecycle records (up to `MAX_LIFECYCLE`). The page is
`report.py`'s, its tables `sections.py`'s.

No I/O of its own: records in, counts out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from egress.audit.read import Summary, client_ip, is_lifecycle, is_request

MAX_POLICIES: Final = 1000  # policy records listed; the rest counted
MAX_LIFECYCLE: Final = 1000  # lifecycle records listed; the rest counted
MAX_SLICES: Final = 200_000  # (client, time slice) counters kept before coarsening
MAX_ERRORS: Final = 10_000  # (reason, destination) error rows kept; the rest counted
MAX_CLIENT_HOSTS: Final = 1000  # hosts reached kept per client; the rest counted together
MAX_PORTS: Final = 16  # ports kept per host reached
MAX_DETAIL: Final = 300  # characters of an error's first detail shown
# what a record is, for the split of tunnels from requests (docs/audit-log.md#egress-audit-report)
KINDS: Final = ("request", "tunnel", "dns", "nowhere")
_SLOT: Final = {"allow": 0, "block": 1, "error": 2}


def kind_of(record: dict[str, object]) -> str:
    """`request`, `tunnel`, `dns` or `nowhere` (a record that names no destination)."""
    method = record.get("method")
    if method == "DNS":
        return "dns"
    if method == "-" or not record.get("host"):
        return "nowhere"
    # SOCKS5 and transparent tunnels are CONNECT records (docs/audit-log.md)
    return "tunnel" if method in ("CONNECT", "FORWARD") else "request"


@dataclass
class Reached:
    """A host the policy let the agent reach: what went there."""

    kinds: list[int] = field(default_factory=lambda: [0, 0, 0])  # request, tunnel, dns
    ports: set[int] = field(default_factory=set)
    bytes_up: int = 0
    bytes_down: int = 0

    def add(self, record: dict[str, object], kind: str) -> None:
        self.kinds[KINDS.index(kind)] += 1
        port = record.get("port")
        if isinstance(port, int) and len(self.ports) < MAX_PORTS:
            self.ports.add(port)
        self.bytes_up += _count(record.get("bytes_up"))
        self.bytes_down += _count(record.get("bytes_down"))


@dataclass
class ClientRow:
    """One client (execution or sandbox): its records by kind and decision, its bytes and
    the hosts it reached."""

    kinds: list[int] = field(default_factory=lambda: [0, 0, 0, 0])  # as KINDS
    decisions: list[int] = field(default_factory=lambda: [0, 0, 0])  # allow, block, error
    bytes_up: int = 0
    bytes_down: int = 0
    hosts: dict[str, int] = field(default_factory=dict)  # host reached -> allowed records
    hosts_more: int = 0  # allowed records to hosts beyond MAX_CLIENT_HOSTS

    def add(self, record: dict[str, object], kind: str, slot: int | None) -> None:
        self.kinds[KINDS.index(kind)] += 1
        if slot is not None:
            self.decisions[slot] += 1
        self.bytes_up += _count(record.get("bytes_up"))
        self.bytes_down += _count(record.get("bytes_down"))
        if slot == 0 and kind != "nowhere":
            host = str(record.get("host"))
            if host in self.hosts or len(self.hosts) < MAX_CLIENT_HOSTS:
                self.hosts[host] = self.hosts.get(host, 0) + 1
            else:
                self.hosts_more += 1


@dataclass
class ErrorRow:
    """Errors of one reason to one destination: how many, and the first one's detail."""

    detail: str
    count: int = 0


def _count(value: object) -> int:
    return value if isinstance(value, int) and value > 0 else 0


@dataclass
class ReportData:
    """What the page shows, fed one record at a time (`add`)."""

    summary: Summary = field(default_factory=Summary)
    # blocked host -> {(reason, rule): count}
    blocked: dict[str, dict[tuple[str, str], int]] = field(default_factory=dict)
    # client -> time slice (a ts prefix: `2026-11-30T05:22:07`) -> [allow, block, error]
    timeline: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    resolution: int = 19  # the ts prefix kept: seconds, coarsened when slices are too many
    slices: int = 0
    policies: list[dict[str, object]] = field(default_factory=list)
    policies_more: int = 0
    lifecycle: list[dict[str, object]] = field(default_factory=list)
    lifecycle_more: int = 0
    kinds: dict[str, list[int]] = field(default_factory=lambda: {k: [0, 0, 0] for k in KINDS})
    reached: dict[str, Reached] = field(default_factory=dict)  # allowed host -> what went
    clients: dict[str, ClientRow] = field(default_factory=dict)
    errors: dict[tuple[str, str], ErrorRow] = field(default_factory=dict)  # (reason, where)
    errors_more: int = 0  # error records beyond MAX_ERRORS distinct rows

    def add(self, record: dict[str, object]) -> None:
        kind = record.get("type")
        if kind == "start":
            self.summary.runs += 1
        elif kind == "policy":
            if len(self.policies) < MAX_POLICIES:
                self.policies.append(record)
            else:
                self.policies_more += 1
        elif is_lifecycle(record):
            self.summary.add_lifecycle(record)
            if len(self.lifecycle) < MAX_LIFECYCLE:
                self.lifecycle.append(record)
            else:
                self.lifecycle_more += 1
        elif is_request(record):
            self._request(record)

    def _request(self, record: dict[str, object]) -> None:
        self.summary.add(record)
        decision = record.get("decision")
        slot = _SLOT.get(decision) if isinstance(decision, str) else None
        kind = kind_of(record)
        client = str(record.get("client_id") or client_ip(record.get("client", "(none)")))
        row = self.clients.get(client)
        if row is None:
            row = self.clients[client] = ClientRow()
        row.add(record, kind, slot)
        if slot is None:
            return
        self.kinds[kind][slot] += 1
        if slot == 0 and kind != "nowhere":
            host = str(record.get("host"))
            reached = self.reached.get(host)
            if reached is None:
                reached = self.reached[host] = Reached()
            reached.add(record, kind)
        elif slot == 2:
            self._error(record, kind)
        if slot == 1:
            host = str(record.get("host") or "(none)")
            rule = record.get("rule")
            key = (str(record.get("reason") or "(none)"), "" if rule is None else str(rule))
            per_host = self.blocked.setdefault(host, {})
            per_host[key] = per_host.get(key, 0) + 1
        ts = record.get("ts")
        if isinstance(ts, str) and len(ts) >= 19:
            client = str(record.get("client_id") or client_ip(record.get("client", "(none)")))
            slices = self.timeline.setdefault(client, {})
            moment = ts[: self.resolution]
            counts = slices.get(moment)
            if counts is None:
                counts = slices[moment] = [0, 0, 0]
                self.slices += 1
                if self.slices > MAX_SLICES:
                    self._coarsen()
                    self._request_slot(client, ts, slot)
                    return
            counts[slot] += 1

    def _error(self, record: dict[str, object], kind: str) -> None:
        where = "(no destination)" if kind == "nowhere" else str(record.get("host"))
        if kind != "nowhere" and isinstance(record.get("port"), int):
            where = f"{where}:{record['port']}"
        key = (str(record.get("reason") or "(none)"), where)
        row = self.errors.get(key)
        if row is None:
            if len(self.errors) >= MAX_ERRORS:
                self.errors_more += 1
                return
            row = self.errors[key] = ErrorRow(str(record.get("detail") or "")[:MAX_DETAIL])
        row.count += 1

    def _request_slot(self, client: str, ts: str, slot: int) -> None:
        slices = self.timeline[client]
        key = ts[: self.resolution]
        slices.setdefault(key, [0, 0, 0])[slot] += 1

    def _coarsen(self) -> None:
        """Seconds -> minutes -> hours -> days: memory stays bounded on long logs."""
        self.resolution = {19: 16, 16: 13}.get(self.resolution, 10)
        merged: dict[str, dict[str, list[int]]] = {}
        for client, slices in self.timeline.items():
            out = merged[client] = {}
            for key, counts in slices.items():
                total = out.setdefault(key[: self.resolution], [0, 0, 0])
                for i in range(3):
                    total[i] += counts[i]
        self.timeline = merged
        self.slices = sum(len(v) for v in merged.values())


__all__ = [
    "KINDS",
    "MAX_CLIENT_HOSTS",
    "MAX_DETAIL",
    "MAX_ERRORS",
    "MAX_LIFECYCLE",
    "MAX_POLICIES",
    "MAX_PORTS",
    "MAX_SLICES",
    "ClientRow",
    "ErrorRow",
    "Reached",
    "ReportData",
    "kind_of",
]

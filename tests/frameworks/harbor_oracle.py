"""The oracle of the Harbor differential test; runs in Harbor's own venv (Python >= 3.12).

Reads JSON lines `{"config": {...}, "dests": [[[spelling, ...], port], ...]}` on stdin and
writes one JSON line per case: `{"legal": false, "error": ...}` when Harbor refuses the config,
else `{"legal": true, "policy": {...}, "allowed": [[bool | null, ...], ...]}` (one verdict per
spelling; a null spelling gets null).

What decides (docs/integrations.md#harbor):

- legality and normalization: Harbor's own code. A task's `[environment]` table is validated
  by `BaselineNetworkPolicyConfig` (host syntax, allowed_hosts only with allowlist) and
  turned into the runtime `NetworkPolicy` by its `resolve_baseline()`; entries are typed by
  Harbor's `classify_network_allowlist_entry`.
- the decision: Harbor 0.26 has no evaluation function; its docker environment enforces a
  `NetworkPolicy` with its egress sidecar (an nftables redirect of every TCP port to a gost
  transparent proxy whose bypass whitelist is `allowed_hosts`, one entry per line, judged on
  the host gost sniffs: the TLS SNI or HTTP Host as the client spelled it, else the
  destination address). gost's bypass (`go-gost/x` `bypass/bypass.go` and
  `internal/matcher`), for the entry types Harbor lets through: a CIDR contains the host when
  it parses as an address (Go's `net.ParseIP`: an IPv4-mapped address counts as IPv4); a
  `*.suffix` is a glob on the lower-cased host (`*` spans dots, so never the apex); a name or
  address equals the lower-cased host as text. The port never matters. `public` allows
  everything, `no-network` nothing.
"""

from __future__ import annotations

import ipaddress
import json
import sys
import warnings

from harbor.models.task.config import (
    BaselineNetworkPolicyConfig,
    NetworkAllowlistEntryType,
    classify_network_allowlist_entry,
)

E = NetworkAllowlistEntryType


def _go_parse_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """`net.ParseIP`: strict dotted quads, IPv6 without a zone; IPv4-mapped is IPv4."""
    if "%" in text:
        return None
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def matches(entry: str, kind: NetworkAllowlistEntryType, host: str) -> bool:
    host = host.lower()
    if kind in (E.IPV4_CIDR, E.IPV6_CIDR):
        addr = _go_parse_ip(host)
        net = ipaddress.ip_network(entry)
        return addr is not None and addr.version == net.version and addr in net
    if kind == E.WILDCARD_HOSTNAME:
        return host.endswith(entry[1:])
    return host == entry


def judge(line: str) -> dict[str, object]:
    case = json.loads(line)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            policy = BaselineNetworkPolicyConfig.model_validate(case["config"]).resolve_baseline()
    except Exception as exc:  # pydantic's ValidationError, or a ValueError it wraps
        return {"legal": False, "error": str(exc).splitlines()[0]}
    mode = policy.network_mode.value
    entries = [(e, classify_network_allowlist_entry(e)) for e in policy.allowed_hosts]

    def gost(host: str | None) -> bool | None:
        if host is None:
            return None
        if mode == "public":
            return True
        if mode == "no-network":
            return False
        return any(matches(e, k, host) for e, k in entries)

    allowed = [[gost(h) for h in spellings] for spellings, _port in case["dests"]]
    return {"legal": True, "policy": policy.model_dump(mode="json"), "allowed": allowed}


def main() -> None:
    for line in sys.stdin:
        if line.strip():
            sys.stdout.write(json.dumps(judge(line)) + "\n")


if __name__ == "__main__":
    main()

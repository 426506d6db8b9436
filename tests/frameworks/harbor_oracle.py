"""The oracle of the Harbor differential test; runs in Harbor's own venv (Python >= 3.12).

Reads JSON lines `{"config": {...}, "dests": [[host, port], ...]}` on stdin and writes one
JSON line per case: `{"legal": false, "error": ...}` when Harbor refuses the config, else
`{"legal": true, "policy": {...}, "allowed": [bool, ...]}`.

What decides (docs/integrations.md#harbor):

- legality and normalization: Harbor's own code. A task's `[environment]` table is validated
  by `BaselineNetworkPolicyConfig` (host syntax, allowed_hosts only with allowlist) and
  turned into the runtime `NetworkPolicy` by its `resolve_baseline()`; entries are typed by
  Harbor's `classify_network_allowlist_entry`.
- the decision: Harbor 0.26 has no evaluation function; its docker environment enforces a
  `NetworkPolicy` with its egress sidecar (an nftables redirect of every TCP port to a gost
  transparent proxy whose allowlist is `allowed_hosts`, one entry per line). The matching
  below is gost's bypass matching for those entry types: a hostname equals the destination
  name; `*.suffix` is a glob matched on the destination's spelling (so never the apex); an
  address equals the destination address; a CIDR contains it; the port never matters.
  `public` allows everything, `no-network` nothing.
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


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def matches(entry: str, kind: NetworkAllowlistEntryType, host: str) -> bool:
    addr = _address(host)
    if kind == E.HOSTNAME:
        return host == entry
    if kind == E.WILDCARD_HOSTNAME:
        return host.endswith(entry[1:]) and len(host) > len(entry) - 1
    if kind in (E.IPV4_ADDRESS, E.IPV6_ADDRESS):
        return addr is not None and addr == ipaddress.ip_address(entry)
    net = ipaddress.ip_network(entry)
    return addr is not None and addr.version == net.version and addr in net


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
    allowed = []
    for host, _port in case["dests"]:
        if mode == "public":
            allowed.append(True)
        elif mode == "no-network":
            allowed.append(False)
        else:
            allowed.append(any(matches(e, k, host) for e, k in entries))
    dumped = policy.model_dump(mode="json")
    return {"legal": True, "policy": dumped, "allowed": allowed}


def main() -> None:
    for line in sys.stdin:
        if line.strip():
            sys.stdout.write(json.dumps(judge(line)) + "\n")


if __name__ == "__main__":
    main()

"""`from_harbor` against Harbor 0.26.0 itself: thousands of generated configs and
destinations, each judged by our policy and by the oracle in `harbor_oracle.py` (Harbor's own
validation and normalization run in Harbor's venv, plus its sidecar's matching; the module
docstring there says exactly what decides). The seed is fixed, so a failure reproduces;
`EGRESS_HARBOR_DIFF_SEED` picks another.
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from egress import Policy, PolicyError, TargetError, from_harbor, make_target

from .harborvenv import harbor_venv

CONFIGS = 3000
DESTS = 6  # per config: 18,000 destinations, each judged on CONNECT and plain HTTP
ORACLE = Path(__file__).with_name("harbor_oracle.py")

LABELS = ["a", "b", "api", "x-1", "pypi", "files", "0day", "w3", "xn--bcher-kva"]
TLDS = ["test", "example", "org", "io"]


def _label(rng: random.Random) -> str:
    # rare corners Harbor accepts and our host syntax cannot name: an invalid IDNA A-label
    return "xn--zz" if rng.random() < 0.005 else rng.choice(LABELS)


def _name(rng: random.Random) -> str:
    labels = [_label(rng) for _ in range(rng.choice([1, 1, 2, 3]))]
    # ... and a numeric last label
    return ".".join([*labels, "123" if rng.random() < 0.01 else rng.choice(TLDS)])


def _v4(rng: random.Random) -> str:
    return str(ipaddress.IPv4Address(rng.choice([0xC6120000, 0x0A000000, 0xCB007100])
                                     + rng.randrange(1 << 12)))  # fmt: skip


def _v6(rng: random.Random) -> str:
    return str(ipaddress.IPv6Address((0x20010DB8 << 96) + rng.randrange(1 << 16)))


def _spell(rng: random.Random, entry: str) -> str:
    """Harbor normalizes case, outer whitespace and trailing dots: spell them freely."""
    if rng.random() < 0.2:
        entry = entry.upper()
    if rng.random() < 0.1:
        entry += "." * rng.choice([1, 2])
    if rng.random() < 0.05:
        entry = f" {entry}\t"
    return entry


def _entry(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.35:
        return _name(rng)
    if kind < 0.55:
        return "*." + _name(rng)
    if kind < 0.65:
        return _v4(rng)
    if kind < 0.7:
        return _v6(rng)
    if kind < 0.8:
        plen = rng.choice([8, 16, 24, 28, 32])
        return str(ipaddress.ip_network(f"{_v4(rng)}/{plen}", strict=False))
    if kind < 0.85:
        plen = rng.choice([32, 64, 112, 128])
        return str(ipaddress.ip_network(f"{_v6(rng)}/{plen}", strict=False))
    return rng.choice([  # what Harbor refuses, and legal corners
        "https://a.test", "a.test:443", "a.test/path", "*", "*.", "a*.test", "*.*.test",
        "[2001:db8::1]", "10.0.0.1/8", "-a.test", "a_b.test", "", " ", "*.10.0.0.1",
        "fe80::1%eth0", "::ffff:10.0.0.1", "::ffff:0:0/96", "1.2.3", "2130706433", "a..test",
        "*.1.2.3", "::/0", "0.0.0.0/0", "a." * 130 + "test", "é.test", "\u212a.test",
    ])  # fmt: skip


def _config(rng: random.Random) -> dict[str, object]:
    mode = rng.choices(["allowlist", "public", "no-network", "PUBLIC", "none"], [70, 10, 10, 1, 1])
    config: dict[str, object] = {}
    if mode[0] != "public" or rng.random() < 0.5:
        config["network_mode"] = mode[0]
    if mode[0] == "allowlist" or rng.random() < 0.05:
        config["allowed_hosts"] = [_spell(rng, _entry(rng)) for _ in range(rng.randrange(6))]
    return config


def _dests(rng: random.Random, config: dict[str, object]) -> list[tuple[str, int]]:
    """Destinations near the entries (the entry, a subdomain, the apex of a wildcard, an
    address inside or beside a network) and unrelated ones, on common and random ports."""
    near: list[str] = []
    for raw in config.get("allowed_hosts", []) or []:  # type: ignore[union-attr]
        e = str(raw).strip().lower().rstrip(".")
        if e.startswith("*."):
            near += [e[2:], "sub." + e[2:], "a.b." + e[2:]]
        elif "/" in e:
            try:
                net = ipaddress.ip_network(e, strict=False)
            except ValueError:
                continue
            last = int(net.broadcast_address) >= (1 << net.max_prefixlen) - 1
            near += [str(net.network_address), "::1" if last else str(net.broadcast_address + 1)]
        else:
            near += [e, "sub." + e]
    dests = []
    for _ in range(DESTS):
        pick = rng.random()
        host = rng.choice(near) if near and pick < 0.6 else (
            _name(rng) if pick < 0.85 else rng.choice([_v4(rng), _v6(rng)]))  # fmt: skip
        port = rng.choice([443, 80, 22, 8443, rng.randrange(1, 65536)])
        dests.append((host, port))
    return dests


def _ours(policy: Policy, host: str, port: int) -> bool | None:
    """Our decision on CONNECT and on plain HTTP (they must agree: Harbor ignores the
    scheme); None when our target syntax refuses the destination itself."""
    try:
        decisions = {policy.decide(make_target(s, host, port)).allowed for s in ("https", "http")}
    except (TargetError, ValueError):
        return None
    assert len(decisions) == 1, (host, port)
    return decisions.pop()


@pytest.mark.timeout(900)  # a first run installs Harbor into a venv of its own
def test_from_harbor_decides_as_harbor(tmp_path_factory: pytest.TempPathFactory) -> None:
    venv = harbor_venv(tmp_path_factory.getbasetemp())
    rng = random.Random(int(os.environ.get("EGRESS_HARBOR_DIFF_SEED", "21")))
    cases = []
    for _ in range(CONFIGS):
        config = _config(rng)
        cases.append({"config": config, "dests": _dests(rng, config)})
    proc = subprocess.run(
        [str(venv / "bin" / "python"), str(ORACLE)],
        input="".join(json.dumps(c) + "\n" for c in cases),
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    verdicts = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(verdicts) == len(cases)
    count: Counter[str] = Counter()
    mismatches = []
    for case, verdict in zip(cases, verdicts, strict=True):
        config = case["config"]
        try:
            policy = from_harbor(config)
        except PolicyError as exc:
            inexpressible = "cannot be expressed exactly" in str(exc)
            if verdict["legal"] and not inexpressible:
                mismatches.append((config, "we refused a legal config", str(exc)))
            if not verdict["legal"] and inexpressible:
                mismatches.append((config, "Harbor refuses this; we called it inexpressible"))
            count["inexpressible" if verdict["legal"] else "illegal"] += 1
            continue
        if not verdict["legal"]:
            mismatches.append((config, "Harbor refuses this config", verdict["error"]))
            continue
        count["legal"] += 1
        for (host, port), want in zip(case["dests"], verdict["allowed"], strict=True):
            got = _ours(policy, host, port)
            if got is None:
                count["dest-unparsable"] += 1
                continue
            count["decisions"] += 1
            if got is not want:
                mismatches.append((config, f"{host}:{port}", f"harbor {want}, ours {got}"))
    legal = count["legal"] + count["inexpressible"]
    print(dict(count))
    assert not mismatches, mismatches[:10]
    assert count["decisions"] >= 10_000
    assert count["inexpressible"] <= 0.10 * legal, dict(count)
    assert count["illegal"] > 100  # the generator covers both
    assert count["legal"] > 1000


@pytest.mark.parametrize(
    "config",
    [
        {"network_mode": "allowlist", "allowed_hosts": [], "extra": 1},
        {"allow_internet": False},
        {"network_mode": "public", "Allowed_hosts": []},
    ],
    ids=["extra", "legacy-allow-internet", "case-matters"],
)
def test_unknown_keys_are_refused(config: dict[str, object]) -> None:
    with pytest.raises(PolicyError, match="unknown key"):
        from_harbor(config)

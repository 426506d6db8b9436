"""`from_harbor` against Harbor 0.26.0 itself (issue 31): thousands of generated configs and
destinations, each judged by our policy and by the oracle in `harbor_oracle.py` (Harbor's own
validation and normalization run in Harbor's venv, plus the gost matching its sidecar
configures; the module docstring there says exactly what decides). The seed is fixed, so a
failure reproduces; `EGRESS_HARBOR_DIFF_SEED` picks another, `EGRESS_HARBOR_DIFF_CONFIGS`
the size.

Destinations are generated as a client may spell them (trailing dots, upper case, IPv4 in
hex/octal/decimal, IPv4-mapped IPv6, ports 0/65535/out of range) and judged by us as our
proxy judges them (normalized; refused when it cannot be). **Wider** is an allow of ours
where gost refuses the destination in its canonical spelling. gost judges the spelling the
client sent, ours the name or address it means: an allow of ours where gost refuses only
the client's spelling (`a.test.` for `a.test`) reaches nothing more and is counted apart;
narrower decisions are counted by class (docs/integrations.md#harbor).
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

from egress import Policy, PolicyError, Target, TargetError, from_harbor, make_target

from .harborvenv import harbor_venv
from .test_verifiers_differential import respell

CONFIGS = int(os.environ.get("EGRESS_HARBOR_DIFF_CONFIGS", "5000"))
DESTS = 6  # per config, each judged on CONNECT and plain HTTP
ORACLE = Path(__file__).with_name("harbor_oracle.py")

LABELS = ["a", "b", "api", "x-1", "pypi", "files", "0day", "w3", "xn--bcher-kva"]
TLDS = ["test", "example", "org", "io"]


def _label(rng: random.Random) -> str:
    # rare corners Harbor accepts and our host syntax cannot name: an invalid IDNA A-label
    return "xn--zz" if rng.random() < 0.003 else rng.choice(LABELS)


def _name(rng: random.Random) -> str:
    labels = [_label(rng) for _ in range(rng.choice([1, 1, 2, 3]))]
    # ... and a numeric last label
    return ".".join([*labels, "123" if rng.random() < 0.005 else rng.choice(TLDS)])


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
    if kind < 0.8:  # Harbor's IP ranges: every prefix length, IPv4 and IPv6
        plen = rng.choice([0, 8, 15, 16, 24, 28, 31, 32])
        return str(ipaddress.ip_network(f"{_v4(rng)}/{plen}", strict=False))
    if kind < 0.85:
        plen = rng.choice([32, 64, 112, 127, 128])
        return str(ipaddress.ip_network(f"{_v6(rng)}/{plen}", strict=False))
    if kind < 0.98:  # what Harbor refuses
        return rng.choice([
            "https://a.test", "a.test:443", "a.test/path", "*", "*.", "a*.test", "*.*.test",
            "[2001:db8::1]", "10.0.0.1/8", "-a.test", "a_b.test", "", " ", "*.10.0.0.1",
            "fe80::1%eth0", "a..test", "a." * 130 + "test", "é.test", "\u212a.test",
            "bücher.test", "*.1.2.3.4", "0x7f.0.0.1/8",
        ])  # fmt: skip
    # legal corners: numeric labels, mapped IPv6, whole ranges
    return rng.choice(["::ffff:10.0.0.1", "::ffff:0:0/96", "1.2.3", "2130706433", "*.1.2.3",
                       "*.1.0x1", "*.0.0.1", "::/0", "0.0.0.0/0", "*.0x1", "a.0x10"])  # fmt: skip


def _config(rng: random.Random) -> dict[str, object]:
    mode = rng.choices(["allowlist", "public", "no-network", "PUBLIC", "none"], [70, 10, 10, 1, 1])
    config: dict[str, object] = {}
    if mode[0] != "public" or rng.random() < 0.5:
        config["network_mode"] = mode[0]
    if mode[0] == "allowlist" or rng.random() < 0.05:
        config["allowed_hosts"] = [_spell(rng, _entry(rng)) for _ in range(rng.randrange(6))]
    return config


def _near(raw: str) -> list[str]:
    """Destinations an entry is about: the entry, a subdomain, the apex of a wildcard, an
    address inside or beside a network."""
    e = str(raw).strip().lower().rstrip(".")
    if e.startswith("*."):
        return [e[2:], "sub." + e[2:], "a.b." + e[2:], "9." + e[2:]]
    if "/" in e:
        try:
            net = ipaddress.ip_network(e, strict=False)
        except ValueError:
            return []
        last = int(net.broadcast_address) >= (1 << net.max_prefixlen) - 1
        inside = net.network_address + min(7, net.num_addresses - 1)
        return [str(inside), "::1" if last else str(net.broadcast_address + 1)]
    return [e, "sub." + e]


def _dests(rng: random.Random, config: dict[str, object]) -> list[tuple[str, int]]:
    near = [h for raw in config.get("allowed_hosts", []) or [] for h in _near(raw)]  # type: ignore[attr-defined]
    dests = []
    for _ in range(DESTS):
        pick = rng.random()
        host = rng.choice(near) if near and pick < 0.6 else (
            _name(rng) if pick < 0.85 else rng.choice([_v4(rng), _v6(rng)]))  # fmt: skip
        if rng.random() < 0.4:
            host = respell(rng, host)
        port = rng.choice([443, 80, 22, 8443, 0, 65535, 70000, rng.randrange(1, 65536)])
        dests.append((host, port))
    return dests


def _ours(policy: Policy, host: str, port: int) -> tuple[Target | None, bool]:
    """Our target and decision, on CONNECT and on plain HTTP (they must agree: Harbor ignores
    the scheme); (None, False) when our proxy refuses the destination itself."""
    try:
        targets = [make_target(s, host, port) for s in ("https", "http")]
    except (TargetError, ValueError):
        return None, False
    decisions = {policy.decide(t).allowed for t in targets}
    assert len(decisions) == 1, (host, port)
    return targets[0], decisions.pop()


def _spelling(sent: str, target: Target) -> str:
    if sent.endswith("."):
        return "a trailing dot"
    if ":" in sent and ":" not in target.host:
        return "IPv4-mapped IPv6"
    if target.ip is not None:
        return "another IPv4 or IPv6 spelling"
    if not sent.isascii():
        return "a Unicode spelling (U-label, fullwidth)"
    return "another spelling"


_WHY = {
    "IDNA": "an invalid A-label",
    "numeric last": "a numeric last label",
    "reads it as": "a name this syntax reads as an address",
    "longer than": "a long name",
    "match no host": "a wildcard matching nothing",
    "IPv4-mapped": "IPv4-mapped IPv6",
}


def _inexpressible(error: str) -> str:
    return next((why for key, why in _WHY.items() if key in error), error)


def run_differential(venv: Path, seed: int, configs: int) -> tuple[Counter[str], list[object]]:
    """Generate, ask Harbor, compare: (counts, the decisions of ours wider than gost's)."""
    rng = random.Random(seed)
    cases = []
    for _ in range(configs):
        config = _config(rng)
        cases.append({"config": config, "dests": _dests(rng, config)})
    wire = []
    for case in cases:
        spellings = []
        for host, port in case["dests"]:
            try:
                canonical: str | None = make_target("https", host, port).host
            except (TargetError, ValueError):
                canonical = None
            spellings.append([[host, canonical], port])
        wire.append({"config": case["config"], "dests": spellings})
    proc = subprocess.run(
        [str(venv / "bin" / "python"), str(ORACLE)],
        input="".join(json.dumps(c) + "\n" for c in wire),
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    verdicts = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(verdicts) == len(cases)
    count: Counter[str] = Counter()
    wider: list[object] = []
    for case, verdict in zip(cases, verdicts, strict=True):
        config = case["config"]
        try:
            policy = from_harbor(config)
        except PolicyError as exc:
            inexpressible = "cannot be expressed exactly" in str(exc)
            if verdict["legal"] and not inexpressible:
                wider.append((config, "we refused a legal config", str(exc)))
            if not verdict["legal"] and inexpressible:
                wider.append((config, "Harbor refuses this; we called it inexpressible"))
            count["inexpressible" if verdict["legal"] else "illegal"] += 1
            if verdict["legal"]:
                count["inexpressible: " + _inexpressible(str(exc))] += 1
            continue
        if not verdict["legal"]:
            wider.append((config, "Harbor refuses this config", verdict["error"]))
            continue
        count["legal"] += 1
        for (host, port), (gost_sent, gost_canonical) in zip(
            case["dests"], verdict["allowed"], strict=True
        ):
            count["destinations"] += 1
            target, got = _ours(policy, host, port)
            if target is None:
                count["refused: our proxy cannot normalize the spelling"] += 1
                continue
            count["allowed" if got else "refused"] += 1
            if got and not gost_canonical:
                rules = [r.text for r in policy.allow_rules]
                wider.append((config, f"{host}:{port}", str(target), rules))
            elif got and not gost_sent:
                count["spelling: gost refuses " + _spelling(host, target)] += 1
            elif gost_canonical and not got:
                count["narrower: " + policy.decide(target).reason] += 1
    return count, wider


@pytest.mark.timeout(900)  # a first run installs Harbor into a venv of its own
def test_from_harbor_never_wider_than_harbor(tmp_path_factory: pytest.TempPathFactory) -> None:
    venv = harbor_venv(tmp_path_factory.getbasetemp())
    seed = int(os.environ.get("EGRESS_HARBOR_DIFF_SEED", "31"))
    count, wider = run_differential(venv, seed, CONFIGS)
    print(dict(count))
    assert not wider, wider[:10]
    legal = count["legal"] + count["inexpressible"]
    assert count["inexpressible"] <= 0.05 * legal, dict(count)
    assert count["destinations"] >= 3 * CONFIGS
    assert count["illegal"] > CONFIGS // 30  # the generator covers both
    assert count["legal"] > CONFIGS // 3
    assert count["allowed"] > CONFIGS // 4


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

"""`from_verifiers` against verifiers 0.4.0 itself (issue 21): thousands of generated runtime
configs, task lists and destinations, each decided by our policy and by verifiers' own
`NetworkPolicyConfig.permits` in verifiers' venv (`verifiers_oracle.py` says exactly which
verifiers code decides). The seed is fixed, so a failure reproduces;
`EGRESS_VERIFIERS_DIFF_SEED` picks another.

Destinations are generated in their canonical spelling (`make_target`), the one our proxy
judges; one our target syntax refuses is counted and left out.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from egress import Policy, PolicyError, TargetError, from_verifiers, make_target

from .frameworkvenv import framework_venv

CONFIGS = 4000
DESTS = 6  # per config
ORACLE = Path(__file__).with_name("verifiers_oracle.py")

LABELS = ["a", "b", "api", "x-1", "pypi", "files", "0day", "w3", "xn--bcher-kva", "a_b"]
TLDS = ["test", "example", "org", "io"]
V4 = ["198.18.0.2", "198.18.7.9", "10.0.0.1", "10.0.0.77", "203.0.113.5"]
V6 = ["2001:db8::1", "2001:db8::ab", "fd00::7"]


def _name(rng: random.Random) -> str:
    return ".".join([*(rng.choice(LABELS) for _ in range(rng.choice([1, 1, 2, 3]))),
                     rng.choice(TLDS)])  # fmt: skip


def _host(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.35:
        return _name(rng)
    if kind < 0.55:
        return "*." + _name(rng)
    if kind < 0.62:
        return rng.choice(V4)
    if kind < 0.66:
        return f"[{rng.choice(V6)}]"
    if kind < 0.72:
        return rng.choice(
            [
                "*",
                "*.",
                "*.*",
                "?.test",
                "a*.test",
                "*a.test",
                "*-1.*",
                "a?i.test",
                "10.0.0.*",
                "*.0.1",
                "10.0.0",
                "198.18.*",
                "*.test.",
                "a.*.test",
            ]
        )
    if kind < 0.8:  # spelled loosely: verifiers lower-cases and strips trailing dots
        name = _name(rng)
        return rng.choice([name.upper(), name + ".", name + "..", "u@" + name])
    # what matches nothing, or what no rule of ours can say
    return rng.choice(["a..test", "[abc", "a b.test", "é.test", "\u212a.test", "xn--zz.test",
                       "-a.test", ".a.test", "[2001:db8::*]", "0:0::1", "[::ffff:10.0.0.1]",
                       "", "a]b.test", "a.123"])  # fmt: skip


def _rule(rng: random.Random) -> str:
    host = _host(rng)
    r = rng.random()
    if r < 0.55:
        text = host
    elif r < 0.75:
        text = f"{host}:{rng.choice([443, 80, 8080, 22, 0, 99999])}"
    elif r < 0.95:
        scheme = rng.choice(["https", "http", "HTTPS", "ws"])
        port = rng.choice(["", "", ":443", ":80", ":8443"])
        text = f"{scheme}://{host}{port}"
    else:
        text = f"{host}:abc" if rng.random() < 0.5 else f"{host}/path"
    return text


def _lists(rng: random.Random) -> tuple[list[str], list[str]]:
    kind = rng.random()
    if kind < 0.35:
        allow = ["*"]
        block = [_rule(rng) for _ in range(rng.randrange(4))]
        if rng.random() < 0.05:
            block.append("*")
    elif kind < 0.4:
        allow, block = [], []
    else:
        allow = [_rule(rng) for _ in range(rng.randrange(1, 5))]
        block = [_rule(rng)] if rng.random() < 0.08 else []  # illegal with a concrete allow
    return allow, block


def _case(rng: random.Random) -> dict[str, object]:
    allow, block = _lists(rng)
    config: dict[str, object] = {}
    if allow != ["*"] or rng.random() < 0.5:
        config["allow"] = allow
    if block or rng.random() < 0.3:
        config["block"] = block
    task = None
    if rng.random() < 0.3:
        t_allow, t_block = _lists(rng)
        task = {"network_allow": t_allow, "network_block": t_block}
    # ModalConfig: `network_access=false` is framework-only and refused with any restriction;
    # `true` with a restriction meets Modal's own checks of what Modal can enforce, which are
    # not the policy's meaning (docs/policy.md#verifiers), so it comes unrestricted only
    if rng.random() < 0.08:
        access = rng.random() < 0.6
        if not access or (allow == ["*"] and not block and task is None):
            config["network_access"] = access
    return {"config": config, "task": task}


def _near(rule: str) -> list[str]:
    """Destinations a rule is about: the host with its globs filled in, a subdomain, the
    apex of a `*.` pattern."""
    host = rule.split("://")[-1].split("/")[0].split("@")[-1]
    if host.startswith("["):
        return [host[1:].split("]")[0]]
    host = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    host = host.lower().rstrip(".")
    filled = host.replace("*", "x").replace("?", "q")
    out = [filled, "sub." + filled]
    if host.startswith("*."):
        out.append(host[2:].replace("*", "x"))
    return out


def _dests(rng: random.Random, case: dict[str, object]) -> list[tuple[str, str, int]]:
    config, task = case["config"], case["task"] or {}
    rules = [*config.get("allow", []), *config.get("block", []),  # type: ignore[attr-defined]
             *task.get("network_allow", []), *task.get("network_block", [])]  # type: ignore[attr-defined]  # fmt: skip
    near = [h for r in rules for h in _near(r)]
    out: list[tuple[str, str, int]] = []
    while len(out) < DESTS:
        pick = rng.random()
        host = rng.choice(near) if near and pick < 0.6 else (
            _name(rng) if pick < 0.85 else rng.choice([*V4, *V6]))  # fmt: skip
        scheme = rng.choice(["https", "http"])
        port = rng.choice([443, 80, 8080, 22, 8443, rng.randrange(1, 65536)])
        try:
            target = make_target(scheme, host, port)  # type: ignore[arg-type]
        except (TargetError, ValueError):
            continue
        out.append((scheme, target.host, port))
    return out


def _ours(policy: Policy, scheme: str, host: str, port: int) -> bool:
    return policy.decide(make_target(scheme, host, port)).allowed  # type: ignore[arg-type]


def test_from_verifiers_decides_as_verifiers(tmp_path_factory: pytest.TempPathFactory) -> None:
    venv = framework_venv("verifiers", tmp_path_factory.getbasetemp())
    rng = random.Random(int(os.environ.get("EGRESS_VERIFIERS_DIFF_SEED", "21")))
    cases = []
    for _ in range(CONFIGS):
        case = _case(rng)
        case["dests"] = _dests(rng, case)
        cases.append(case)
    proc = subprocess.run(
        [str(venv / "bin" / "python"), str(ORACLE)],
        input="".join(json.dumps(c) + "\n" for c in cases),
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
        cwd=str(venv),
    )
    verdicts = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(verdicts) == len(cases)
    count: Counter[str] = Counter()
    mismatches = []
    for case, verdict in zip(cases, verdicts, strict=True):
        try:
            policy = from_verifiers(case["config"], task=case["task"])
        except PolicyError as exc:
            inexpressible = "cannot be expressed exactly" in str(exc)
            if verdict["legal"] and not inexpressible:
                mismatches.append((case, "we refused a legal config", str(exc)))
            if not verdict["legal"] and inexpressible:
                mismatches.append((case, "verifiers refuses this; we called it inexpressible"))
            count["inexpressible" if verdict["legal"] else "illegal"] += 1
            continue
        if not verdict["legal"]:
            mismatches.append((case, "verifiers refuses this config", verdict["error"]))
            continue
        count["legal"] += 1
        count["framework-only"] += not policy.allow_rules and policy.default == "deny"
        for (scheme, host, port), want in zip(case["dests"], verdict["allowed"], strict=True):
            count["decisions"] += 1
            count["allowed" if want else "refused"] += 1
            got = _ours(policy, scheme, host, port)
            if got is not want:
                mismatches.append(
                    (case["config"], case["task"], f"{scheme}://{host}:{port}",
                     f"verifiers {want}, ours {got}", policy.allow_rules, policy.block_rules)
                )  # fmt: skip
    legal = count["legal"] + count["inexpressible"]
    print(dict(count))
    assert not mismatches, mismatches[:10]
    assert count["decisions"] >= 10_000
    assert count["inexpressible"] <= 0.10 * legal, dict(count)
    assert count["illegal"] > 100  # the generator covers both
    assert count["allowed"] > 2000
    assert count["refused"] > 2000


@pytest.mark.parametrize(
    "config",
    [{"allow": [], "extra": 1}, {"Allow": ["*"]}, {"network_allow": [], "allow": []}],
    ids=["extra", "case-matters", "task-and-config-keys"],
)
def test_unknown_keys_are_refused(config: dict[str, object]) -> None:
    with pytest.raises(PolicyError, match="unknown key"):
        from_verifiers(config)

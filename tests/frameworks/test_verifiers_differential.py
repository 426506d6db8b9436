"""`from_verifiers` against verifiers 0.4.0 itself (issues 21, 31): thousands of generated
runtime configs, task lists and destinations, each decided by our policy and by verifiers'
own code in verifiers' venv (`verifiers_oracle.py` says exactly which code decides): its
proxy's `NetworkPolicy.permits(connect=True)` by default, `NetworkPolicyConfig.permits` under
`any_connect_port=True`. The seed is fixed, so a failure reproduces;
`EGRESS_VERIFIERS_DIFF_SEED` picks another, `EGRESS_VERIFIERS_DIFF_CONFIGS` the size.

Destinations are generated as a client may spell them (IDN, hex/octal/decimal IPv4,
IPv4-mapped and embedded IPv6, trailing dots, upper case, ports 0/65535/out of range) and
judged by us as our proxy judges them (normalized; refused when it cannot be). **Wider** is
an allow of ours where verifiers refuses the name in its canonical spelling and in its U-label
spelling (one name, docs/policy.md#verifiers), or where a block rule of verifiers matches any
of those spellings or the one the client sent. Narrower decisions are counted by class; every
class is listed in docs/policy.md#verifiers.
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
import subprocess
from collections import Counter
from pathlib import Path

import idna
import pytest

from egress import Policy, PolicyError, Target, TargetError, from_verifiers, make_target

from .frameworkvenv import framework_venv

CONFIGS = int(os.environ.get("EGRESS_VERIFIERS_DIFF_CONFIGS", "5000"))
DESTS = 8  # per config
ORACLE = Path(__file__).with_name("verifiers_oracle.py")

LABELS = ["a", "b", "api", "x-1", "pypi", "files", "0day", "w3", "xn--bcher-kva", "a_b"]
IDN = ["bücher", "münchen", "faß", "ｅｖｉｌ", "ev\u200bil", "e\u00advil", "BÜCHER", "\u212a"]
TLDS = ["test", "example", "org", "io", "de"]
V4 = ["198.18.0.2", "198.18.7.9", "10.0.0.1", "10.0.0.77", "203.0.113.5", "8.8.8.8", "127.0.0.1"]
V6 = ["2001:db8::1", "2001:db8::ab", "fd00::7", "::ffff:10.0.0.1", "::1.2.0.1", "::1"]
NETS = ["10.0.0.0/8", "198.18.0.0/15", "203.0.113.0/24", "2001:db8::/32", "::ffff:10.0.0.0/104"]
GLOBS = ["*", "*.", "*.*", "a*.test", "*a.test", "*-1.*", "10.0.0.*", "*.0.1", "10.0.0", "0.1",
         "5.1", "198.18.*", "*.test.", "a.*.test", "*f*", "*.bücher.de", "*.0x1", "1*"]  # fmt: skip
PORTS = [443, 80, 8080, 22, 0, 65535, 99999]


def _label(rng: random.Random) -> str:
    return rng.choice(IDN) if rng.random() < 0.12 else rng.choice(LABELS)


def _name(rng: random.Random) -> str:
    labels = [_label(rng) for _ in range(rng.choice([1, 1, 2, 3]))]
    sep = "。" if rng.random() < 0.03 else "."
    return sep.join([*labels, rng.choice(TLDS)])


def spell_v4(rng: random.Random, text: str) -> str:
    """One of the spellings inet_aton reads as `text` (hex, octal, decimal, short forms)."""
    n = int(ipaddress.IPv4Address(text))
    b = [(n >> s) & 0xFF for s in (24, 16, 8, 0)]
    return rng.choice([
        text, str(n), hex(n), ".".join(f"0{x:o}" for x in b), ".".join(hex(x) for x in b),
        f"{b[0]}.{b[1]}.{(n & 0xFFFF)}", f"{b[0]}.{n & 0xFFFFFF}",
        f"{b[0]}.{b[1]}.{b[2]}.{hex(b[3])}", text.upper() + ".", hex(n).upper(),
    ])  # fmt: skip


def _host(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.3:
        return _name(rng)
    if kind < 0.45:
        return "*." + _name(rng)
    if kind < 0.55:
        return spell_v4(rng, rng.choice(V4))
    if kind < 0.6:
        return f"[{rng.choice(V6)}]"
    if kind < 0.72:
        return rng.choice(GLOBS)
    if kind < 0.8:  # spelled loosely: verifiers lower-cases and strips trailing dots
        name = _name(rng)
        return rng.choice([name.upper(), name + ".", name + "..", "u@" + name])
    if kind < 0.84:
        return rng.choice([*NETS, *V6, "fe80::1%eth0"])  # CIDRs and bare IPv6: no brackets
    # what matches nothing, or what no rule of ours can say
    return rng.choice(["a..test", "[abc", "a b.test", "xn--zz.test", "-a.test", ".a.test",
                       "[2001:db8::*]", "[0:0::1]", "", "a]b.test", "a.123", "0x7f?.local",
                       "a/b.test", "a%41.test"])  # fmt: skip


def _rule(rng: random.Random) -> str:
    host = _host(rng)
    r = rng.random()
    if r < 0.5:
        return host
    if r < 0.7:
        return f"{host}:{rng.choice(PORTS)}"
    if r < 0.93:
        scheme = rng.choice(["https", "http", "HTTPS", "ws", "ftp"])
        port = rng.choice(["", "", ":443", ":80", ":8443", ":8080"])
        tail = rng.choice(["", "", "/path", "/v1?q=1", "?q=1", "#f"])
        return f"{scheme}://{host}{port}{tail}"
    return rng.choice([f"{host}:abc", f"{host}/path", f"{host}:80?q=1", f"{host}?x"])


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
    return {"config": config, "task": task, "any_port": rng.random() < 0.2}


def _near(rule: str) -> list[str]:
    """Hosts a rule is about: the host with its globs filled in, a subdomain, the apex of a
    `*.` pattern, an address in a CIDR."""
    if "/" in rule and "://" not in rule:
        try:
            net = ipaddress.ip_network(rule, strict=False)
            return [str(net.network_address + min(5, net.num_addresses - 1))]
        except ValueError:
            pass
    host = rule.split("://")[-1].split("/")[0].split("?")[0].split("@")[-1]
    if host.startswith("["):
        return [host[1:].split("]")[0]]
    if host.count(":") > 1:
        return [host]
    host = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    host = host.lower().rstrip(".")
    filled = host.replace("*", "x")
    out = [filled, "sub." + filled, "9." + filled]
    if host.startswith("*."):
        out.append(host[2:].replace("*", "x"))
    return out


def respell(rng: random.Random, host: str) -> str:
    """Another spelling a client may send for `host`."""
    try:
        target = make_target("https", host, 443)
    except (TargetError, ValueError):
        return host
    canonical, r = target.host, rng.random()
    if target.ip is not None and target.ip.version == 4:
        if r < 0.6:
            return spell_v4(rng, canonical)
        return rng.choice([f"::ffff:{canonical}", f"::FFFF:{canonical}"])
    if target.ip is not None:
        return canonical.upper()
    if r < 0.4:
        return u_label(canonical) or canonical.upper()
    if r < 0.6:
        return canonical + "."
    if r < 0.8:
        return canonical.upper()
    return "".join(chr(ord(c) + 0xFEE0) if c.isalnum() else c for c in canonical)  # fullwidth


def u_label(canonical: str) -> str | None:
    """The U-label spelling of a canonical name (every A-label decoded), None if none."""
    if "xn--" not in canonical:
        return None
    try:
        return ".".join(
            idna.decode(label) if label.startswith("xn--") else label
            for label in canonical.split(".")
        )
    except (idna.IDNAError, UnicodeError):
        return None


def _dests(rng: random.Random, case: dict[str, object]) -> list[tuple[str, str, int]]:
    config, task = case["config"], case["task"] or {}
    rules = [*config.get("allow", []), *config.get("block", []),  # type: ignore[attr-defined]
             *task.get("network_allow", []), *task.get("network_block", [])]  # type: ignore[attr-defined]  # fmt: skip
    near = [h for r in rules for h in _near(r)]
    out: list[tuple[str, str, int]] = []
    for _ in range(DESTS):
        pick = rng.random()
        others = [*V4, *V6, "localhost", "a.localhost"]
        host = rng.choice(near) if near and pick < 0.6 else (
            _name(rng) if pick < 0.8 else rng.choice(others))  # fmt: skip
        if rng.random() < 0.5:
            host = respell(rng, host)
        port = rng.choice([443, 443, 80, 80, 8080, 22, 8443, 65535, 0, rng.randrange(1, 65536)])
        out.append((rng.choice(["https", "http"]), host, port))
    return out


def _spellings(scheme: str, host: str, port: int) -> tuple[Target | None, list[str | None]]:
    """(our proxy's target, None when it refuses the spelling; [as sent, canonical,
    U-label])."""
    try:
        target = make_target(scheme, host, port)  # type: ignore[arg-type]
    except (TargetError, ValueError):
        return None, [host, None, None]
    return target, [host, target.host, u_label(target.host)]


def _narrower(policy: Policy, target: Target) -> str:
    """The class of a refusal of ours where verifiers allows (docs/policy.md#verifiers)."""
    decision = policy.decide(target)
    if decision.allowed:
        return "address guard: a loopback address (verifiers' permits alone allows it)"
    rule = decision.rule or ""
    if decision.reason == "block_rule":
        if rule in ("0.0.0.0/0:*", "::/0:*"):
            return "block: every address literal (a glob or short numeric block)"
        if "/" in rule:
            return "block: a CIDR kept whole"
        if rule.startswith("*.localhost"):
            return "block: loopback names"
        return "block: every spelling of a blocked name or address"
    if target.scheme == "http" and target.port != 80:
        return "plain HTTP to a port other than 80 under a rule without port or scheme"
    return f"other: {decision.reason}"


def run_differential(venv: Path, seed: int, configs: int) -> tuple[Counter[str], list[object]]:
    """Generate, ask verifiers, compare: (counts, the decisions of ours wider than theirs)."""
    rng = random.Random(seed)
    cases = []
    for _ in range(configs):
        case = _case(rng)
        dests = _dests(rng, case)
        case["ours"] = [_spellings(*d) for d in dests]
        case["dests"] = [[d[0], sp, d[2]] for d, (_, sp) in zip(dests, case["ours"], strict=True)]
        cases.append(case)
    wire = [{k: c[k] for k in ("config", "task", "any_port", "dests")} for c in cases]
    proc = subprocess.run(
        [str(venv / "bin" / "python"), str(ORACLE)],
        input="".join(json.dumps(c) + "\n" for c in wire),
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
        cwd=str(venv),
    )
    verdicts = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(verdicts) == len(cases)
    count: Counter[str] = Counter()
    wider: list[object] = []
    for case, verdict in zip(cases, verdicts, strict=True):
        try:
            policy = from_verifiers(case["config"], task=case["task"],
                                    any_connect_port=case["any_port"])  # fmt: skip
        except PolicyError as exc:
            inexpressible = "cannot be expressed exactly" in str(exc)
            if verdict["legal"] and not inexpressible:
                wider.append((case["config"], "we refused a legal config", str(exc)))
            if not verdict["legal"] and inexpressible:
                wider.append((case["config"], "verifiers refuses it; we: inexpressible"))
            count["inexpressible" if verdict["legal"] else "illegal"] += 1
            continue
        if not verdict["legal"]:
            wider.append((case["config"], "verifiers refuses this config", verdict["error"]))
            continue
        count["legal"] += 1
        for (target, spellings), judged in zip(case["ours"], verdict["verdicts"], strict=True):
            count["destinations"] += 1
            permitted = any(j is not None and j[0] for j in judged[1:])
            want = permitted and not any(j is not None and j[1] for j in judged)
            if target is None:
                count["refused: our proxy cannot normalize the spelling"] += 1
                continue
            guarded = target.ip is not None and target.ip.is_loopback  # our address guard
            got = policy.decide(target).allowed and not guarded
            count["allowed" if got else "refused"] += 1
            if got and not want:
                wider.append(
                    (case["config"], case["task"], case["any_port"], str(target), spellings,
                     judged, [r.text for r in policy.allow_rules],
                     [r.text for r in policy.block_rules])
                )  # fmt: skip
            elif want and not got:
                count["narrower: " + _narrower(policy, target)] += 1
    return count, wider


def test_from_verifiers_never_wider_than_verifiers(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    venv = framework_venv("verifiers", tmp_path_factory.getbasetemp())
    seed = int(os.environ.get("EGRESS_VERIFIERS_DIFF_SEED", "31"))
    count, wider = run_differential(venv, seed, CONFIGS)
    print(dict(count))
    assert not wider, wider[:10]
    legal = count["legal"] + count["inexpressible"]
    assert count["inexpressible"] <= 0.05 * legal, dict(count)
    assert count["destinations"] >= 5 * CONFIGS
    assert count["illegal"] > CONFIGS // 40  # the generator covers both
    assert count["allowed"] > CONFIGS // 2
    assert count["refused"] > CONFIGS // 2


@pytest.mark.parametrize(
    "config",
    [{"allow": [], "extra": 1}, {"Allow": ["*"]}, {"network_allow": [], "allow": []}],
    ids=["extra", "case-matters", "task-and-config-keys"],
)
def test_unknown_keys_are_refused(config: dict[str, object]) -> None:
    with pytest.raises(PolicyError, match="unknown key"):
        from_verifiers(config)

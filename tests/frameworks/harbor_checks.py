"""Checks of `egress.integrations.harbor` that need Harbor's own classes but no sandbox; run
in Harbor's venv by `test_harbor_environments.py` (prints `ok N` per check, exits 1 on the
first failure).

- `EgressDockerEnvironment` is Harbor's docker environment without its gost sidecar: Harbor's
  own start-up validation accepts allowlist and no-network phases, and the compose project
  gets no sidecar (`_enable_egress_control` is what adds it);
- Harbor itself refuses an IPv6 allowlist entry before start (a cut sandbox has no IPv6);
- `phase_policy` turns the model host into a framework route and composes an evaluator;
- the services Harbor would put behind its sidecar share one namespace, held by
  `NETNS_SERVICE` (only when a policy of the trial is restricted, as Harbor decides), with
  NET_ADMIN/NET_RAW/SYS_ADMIN dropped; a task service of that name is refused;
- the `egress_policy` file is honoured in full (policy, `resolve` pins, `reserve`,
  `reserve_private`) or refused naming the key (`[clients]`, `mode = "report"`).
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from ipaddress import ip_address
from pathlib import Path

from harbor.models.task.config import EnvironmentConfig, NetworkPolicy
from harbor.models.trial.paths import TrialPaths

from egress import EgressProxy, Policy, PolicyError, make_target
from egress.integrations.harbor import (
    NETNS_SERVICE,
    EgressDockerEnvironment,
    NamespaceEnvironment,
    load_evaluator,
    phase_policy,
    shared_namespace_override,
)

ALLOW = NetworkPolicy(network_mode="allowlist", allowed_hosts=["pypi.org", "198.18.0.1"])
NONE = NetworkPolicy(network_mode="no-network")
V6 = NetworkPolicy(network_mode="allowlist", allowed_hosts=["2001:db8::1"])


def environment(cls: type, tmp: Path, phases: list[NetworkPolicy], **kw: object) -> object:
    env_dir = tmp / "environment"
    env_dir.mkdir(exist_ok=True)
    (env_dir / "Dockerfile").write_text("FROM scratch\n")
    return cls(
        environment_dir=env_dir,
        environment_name="t",
        session_id="t1__env",
        trial_paths=TrialPaths(tmp / "trial"),
        task_env_config=EnvironmentConfig(),
        network_policy=NetworkPolicy(),
        phase_network_policies=phases,
        **kw,
    )


def check_docker(tmp: Path) -> None:
    env = environment(EgressDockerEnvironment, tmp, [ALLOW, NONE])
    caps = env.capabilities  # type: ignore[attr-defined]
    assert caps.network_allowlist
    assert caps.dynamic_network_policy
    assert caps.disable_internet
    assert env._enable_egress_control is False  # type: ignore[attr-defined]  # no sidecar


def check_shared_namespace(tmp: Path) -> None:
    restricted = environment(EgressDockerEnvironment, tmp, [ALLOW])
    public = environment(EgressDockerEnvironment, tmp, [NetworkPolicy()])
    assert restricted._egress_shared is True  # type: ignore[attr-defined]
    assert public._egress_shared is False  # type: ignore[attr-defined]  # Harbor's own layout
    compose = tmp / "environment" / "docker-compose.yaml"
    compose.write_text(
        "services:\n  db: {image: x}\n  side: {image: x, networks: [own]}\n"
        "  peer: {image: x, network_mode: host}\n"
    )
    services = restricted._egress_controlled_service_names()  # type: ignore[attr-defined]
    assert sorted(services) == ["db", "main"], services  # Harbor's own selection
    override = shared_namespace_override(services, "img:1")["services"]
    assert sorted(override) == sorted([NETNS_SERVICE, "db", "main"])
    holder = override[NETNS_SERVICE]
    assert (holder["image"], holder["cap_drop"], holder["pull_policy"]) == (
        "img:1",
        ["ALL"],
        "never",
    )
    for name in ("db", "main"):
        assert override[name]["network_mode"] == f"service:{NETNS_SERVICE}"
        assert set(override[name]["cap_drop"]) == {"NET_ADMIN", "NET_RAW", "SYS_ADMIN"}
    try:
        shared_namespace_override(["main", NETNS_SERVICE], "img:1")
        clash = "accepted"
    except ValueError as exc:
        clash = str(exc)
    assert "rename it" in clash, clash


def check_namespace(tmp: Path) -> None:
    env = environment(NamespaceEnvironment, tmp, [ALLOW, NONE])
    assert env.capabilities.network_allowlist_wildcard_hostnames  # type: ignore[attr-defined]


def refusal(cls: type, tmp: Path, phases: list[NetworkPolicy]) -> str:
    try:
        environment(cls, tmp, phases)
    except ValueError as exc:
        return str(exc)
    return f"{cls.__name__} accepted {phases}"


def check_ipv6_refused_by_harbor(tmp: Path) -> None:
    for cls in (EgressDockerEnvironment, NamespaceEnvironment):
        message = refusal(cls, tmp, [V6])
        assert "IPv6 addresses is not supported" in message, message


def check_phase_policy(_: Path) -> None:
    policy = phase_policy(ALLOW, ["http://198.18.0.1:8089/v1"])
    assert [r.text for r in policy.allow_rules] == ["pypi.org:*"]
    assert policy.decide(make_target("https", "pypi.org", 22)).allowed
    # the model host is not an any-port allow rule (prepare_execution adds the route)
    assert not policy.decide(make_target("http", "198.18.0.1", 80)).allowed
    evaluator = Policy(allow=["*.org:*"], block=["evil.org"])
    composed = phase_policy(ALLOW, (), evaluator)
    assert [r.text for r in composed.block_rules] == ["evil.org"]
    assert [r.text for r in composed.allow_rules] == ["*.org:*", "pypi.org:*"]
    assert phase_policy(NONE, ["http://198.18.0.1:8089/v1"]).allow_rules == ()


def check_evaluator_file(tmp: Path) -> None:
    path = tmp / "evaluator.toml"
    path.write_text(
        'block = ["evil.test"]\ndefault = "allow"\n'
        'resolve = {"allowed.test" = "198.18.0.7"}\nreserve = ["198.18.9.0/24"]\n'
        "reserve_private = true\n"
    )
    file = load_evaluator(str(path))
    assert file is not None
    assert [r.text for r in file.policy.block_rules] == ["evil.test"]
    for cls in (NamespaceEnvironment, EgressDockerEnvironment):
        env = environment(cls, tmp, [ALLOW], egress_policy=str(path))
        kept = env._egress_evaluator  # type: ignore[attr-defined]
        assert (kept.pins, kept.reserve) == (file.pins, file.reserve), kept
    proxy = EgressProxy(Policy(), resolve={"other.test": "198.18.0.8"})
    file.apply_to(proxy)
    assert [str(a) for a in proxy.resolver.pins["allowed.test"]] == ["198.18.0.7"]
    guard = proxy.gate.guard
    for addr in ("198.18.9.1", "10.1.2.3", "192.168.1.1"):
        assert guard.check([ip_address(addr)]) is not None, addr  # reserved now
    assert guard.check([ip_address("198.18.0.7")]) is None
    file.apply_to(proxy)  # the same pins again: fine
    clash = EgressProxy(Policy(), resolve={"allowed.test": "198.18.0.9"})
    assert "already pins it to 198.18.0.9" in policy_error(lambda: file.apply_to(clash))
    for text, key in (('[clients.a]\nallow = ["x.test"]\n', "[clients]"),
                      ('mode = "report"\n', "mode = 'report'")):  # fmt: skip
        path.write_text(text)
        message = policy_error(lambda: load_evaluator(str(path)))
        assert key in message, message


def policy_error(call: Callable[[], object]) -> str:
    try:
        call()
    except PolicyError as exc:
        return str(exc)
    raise AssertionError(f"{call} raised no PolicyError")


def main() -> None:
    checks = [check_docker, check_shared_namespace, check_namespace,
              check_ipv6_refused_by_harbor, check_phase_policy, check_evaluator_file]  # fmt: skip
    for n, check in enumerate(checks, 1):
        with tempfile.TemporaryDirectory() as tmp:
            check(Path(tmp))
        print(f"ok {n} {check.__name__}")
    sys.exit(0)


if __name__ == "__main__":
    main()

"""The oracle for `from_verifiers`, run in verifiers' own venv: JSON lines in, one verdict
per line out. Everything that decides is verifiers 0.4.0's own code:

- a runtime config is validated by `NetworkPolicyConfig` (or `ModalConfig` when it says
  `network_access`);
- a task's lists are applied by `resolve_runtime_config` (`verifiers/v1/utils/compile.py`,
  what `Agent.run` calls) on a real `Task(TaskData(...))`;
- `network_access=False` is `NetworkPolicyConfig(allow=[])`, the one expression in
  `Rollout.__init__` (`verifiers/v1/rollout.py`) that decides it, transcribed;
- a destination is judged by verifiers' own proxy check, `NetworkPolicy(config,
  routes=[]).permits(scheme, host, port, connect=...)` (`verifiers/v1/runtimes/docker/
  egress.py`; a CONNECT is `https`, an absolute-form request `http`), or with `"any_port"`
  by `NetworkPolicyConfig.permits(scheme, host, port)` alone;
- whether a block rule matches a spelling is `network_rule_matches(rule, scheme, host, port,
  subdomains=True)` over the config's `block`, as `permits` asks it.

Input line: `{"config": {...}, "task": {...} | null, "any_port": bool,
"dests": [[scheme, [spelling, ...], port], ...]}`.
Output line: `{"legal": true, "verdicts": [[[permitted, blocked], ...], ...]}` (one pair per
spelling; a null spelling gets null) or `{"legal": false, "error": "..."}`.
"""

import json
import sys

from pydantic import ValidationError
from verifiers.v1.configs.runtime import NetworkPolicyConfig, network_rule_matches
from verifiers.v1.runtimes.docker.egress import NetworkPolicy
from verifiers.v1.runtimes.modal import ModalConfig
from verifiers.v1.task import Task, TaskData
from verifiers.v1.utils.compile import resolve_runtime_config


def policy(config: dict, task: dict | None) -> NetworkPolicyConfig:
    cls = ModalConfig if "network_access" in config else NetworkPolicyConfig
    runtime = cls.model_validate(config)
    if task is not None:
        runtime = resolve_runtime_config(runtime, Task(TaskData(prompt="x", **task)))
    if isinstance(runtime, ModalConfig) and not runtime.network_access:
        return NetworkPolicyConfig(allow=[])
    return runtime


def verdict(config: NetworkPolicyConfig, any_port: bool, scheme: str, host: str, port: int):
    """[permitted, blocked]: verifiers' decision, and whether a block rule matches."""
    if any_port:
        permitted = config.permits(scheme, host, port)
    else:
        proxy = NetworkPolicy(config, routes=[])
        permitted = proxy.permits(scheme, host, port, connect=scheme == "https")
    blocked = any(
        network_rule_matches(rule, scheme, host, port, subdomains=True) for rule in config.block
    )
    return [permitted, blocked]


def main() -> None:
    for line in sys.stdin:
        case = json.loads(line)
        try:
            config = policy(case["config"], case["task"])
        except (ValidationError, ValueError, TypeError) as exc:
            out = {"legal": False, "error": str(exc).splitlines()[0]}
        else:
            out = {"legal": True, "verdicts": [
                [None if host is None else verdict(config, case["any_port"], scheme, host, port)
                 for host in spellings]
                for scheme, spellings, port in case["dests"]
            ]}  # fmt: skip
        sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()

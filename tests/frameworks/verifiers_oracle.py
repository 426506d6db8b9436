"""The oracle for `from_verifiers`, run in verifiers' own venv: JSON lines in, one verdict
per line out. Everything that decides is verifiers 0.4.0's own code:

- a runtime config is validated by `NetworkPolicyConfig` (or `ModalConfig` when it says
  `network_access`);
- a task's lists are applied by `resolve_runtime_config` (`verifiers/v1/utils/compile.py`,
  what `Agent.run` calls) on a real `Task(TaskData(...))`;
- `network_access=False` is `NetworkPolicyConfig(allow=[])`, the one expression in
  `Rollout.__init__` (`verifiers/v1/rollout.py`) that decides it, transcribed;
- each destination is judged by `NetworkPolicyConfig.permits(scheme, host, port)`.

Input line: `{"config": {...}, "task": {...} | null, "dests": [[scheme, host, port], ...]}`.
Output line: `{"legal": true, "allowed": [...]}` or `{"legal": false, "error": "..."}`.
"""

import json
import sys

from pydantic import ValidationError
from verifiers.v1.configs.runtime import NetworkPolicyConfig
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


def main() -> None:
    for line in sys.stdin:
        case = json.loads(line)
        try:
            judge = policy(case["config"], case["task"])
        except (ValidationError, ValueError, TypeError) as exc:
            out = {"legal": False, "error": str(exc).splitlines()[0]}
        else:
            out = {"legal": True, "allowed": [judge.permits(*d) for d in case["dests"]]}
        sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()

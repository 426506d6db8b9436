"""Harbor tasks that egress cannot run behind their policy exactly, through inspect-harbor's
own entry point with `sandbox_env_name="egress"` (run by test_inspect_harbor_refusals.py in
the inspect-harbor venv, with no `docker` on PATH: a refusal must come before anything
starts). Also a compose config that is not a Harbor task's (no `harbor_config`).

argv: TMP. Prints one JSON object: case -> the sample's error message (or null).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.util import ComposeConfig
from inspect_harbor import harbor, oracle

ENV = '[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["{host}"]\n'
CASES = {
    # a published port: the service would have networking of its own
    "ports": ("pypi.org", {"services": {"main": {"image": "task", "ports": ["8080:80"]}}}),
    # a capability that could undo the cut
    "cap_add": ("pypi.org", {"services": {"main": {"image": "task", "cap_add": ["NET_ADMIN"]}}}),
    # the service egress names its namespace holder
    "holder_name": (
        "pypi.org",
        {"services": {"main": {"image": "t"}, "egress-netns": {"image": "t"}}},
    ),
    # an IPv6 entry: a cut sandbox has no IPv6 (from_harbor refuses it)
    "ipv6": ("2001:db8::1", {"services": {"main": {"image": "task"}}}),
}


def error(task: Task, tmp: Path) -> str | None:
    [log] = eval(task, solver=oracle(), model="mockllm/model", display="none",
                 log_dir=str(tmp / "logs"))  # fmt: skip
    sample = log.samples[0] if log.samples else None
    if sample is None:
        return f"no sample: {log.error.message if log.error else log.status}"
    return str(sample.error.message) if sample.error else None


def main(tmp: Path) -> None:
    said: dict[str, str | None] = {}
    for case, (host, compose) in CASES.items():
        task = tmp / case
        for sub in ("environment", "solution", "tests"):
            (task / sub).mkdir(parents=True)
        (task / "task.toml").write_text(ENV.format(host=host))
        (task / "instruction.md").write_text("Nothing.\n")
        (task / "environment" / "docker-compose.yaml").write_text(json.dumps(compose))
        (task / "solution" / "solve.sh").write_text("#!/bin/sh\ntrue\n")
        (task / "tests" / "test.sh").write_text("#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n")
        said[case] = error(harbor(path=str(task), sandbox_env_name="egress"), tmp)
    plain = Task(dataset=[Sample(input="x", sandbox=("egress", ComposeConfig(services={})))])
    said["no_harbor_config"] = error(plain, tmp)
    print(json.dumps(said))


if __name__ == "__main__":
    main(Path(sys.argv[1]))

"""verifiers' own runtime lifecycle with egress's namespace runtime (verifiers 0.4.0, in its
venv, run by test_verifiers_netns.py): `agent.provision(task)` starts a `NamespaceRuntime`
(chosen by `install("namespace")` from verifiers' own `DockerConfig`) that makes a `vfns-*`
namespace of its own, a scripted rollout is cut in it, and verifiers ends the runtime with
`stop()`, which runs `teardown()` and not `cleanup()`.

argv[1]: JSON with `audit` and `tasks` (how many rollouts). Prints one JSON object: per
rollout, the namespace its runtime made, whether `ip netns list` showed it during the rollout,
and the namespaces of this run that it still showed right after the provision ended (before
verifiers' atexit backstop, which calls `cleanup()`, could hide a runtime that forgot it).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import scripted_harness
from verifiers.v1.agent import Agent
from verifiers.v1.configs.agent import AgentConfig
from verifiers.v1.configs.harness import HarnessConfig
from verifiers.v1.runtimes.docker import DockerConfig
from verifiers.v1.task import Task, TaskData

import egress
from egress.integrations.verifiers import install


def namespaces() -> set[str]:
    """The names `ip netns list` shows (each line is `name` or `name (id: N)`)."""
    out = subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


async def main(spec: dict[str, Any]) -> None:
    egress.configure_shared_proxy(audit=spec["audit"])
    install("namespace")
    config = AgentConfig(
        model="scripted", harness=HarnessConfig(id="scripted_harness"), runtime=DockerConfig()
    )
    results: list[dict[str, Any]] = []
    async with Agent(config) as agent:
        for _ in range(spec["tasks"]):
            scripted_harness.COMMANDS[:] = ["true"]
            task = Task(TaskData(prompt="run", network_allow=["allowed.test"]))
            async with agent.provision(task) as runtime:
                name = runtime.netns
                trace = await agent.run(task, runtime=runtime)
                during = name in namespaces()
            made = {r["netns"] for r in results} | {name}
            results.append({
                "runtime": type(runtime).__name__,
                "netns": name,
                "seen_during": during,
                "ok": trace.ok,
                "errors": [str(e) for e in trace.errors],
                "left_after": sorted(made & namespaces()),
            })  # fmt: skip
    print(json.dumps(results))


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))

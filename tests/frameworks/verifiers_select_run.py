"""verifiers' documented path with egress chosen by `install()` (verifiers 0.4.0, in its venv,
run by test_verifiers_select.py): the agent's config is verifiers' own (`DockerConfig`), the
task carries `network_allow` / `network_block`, and `agent.provision(task)` must yield egress's
runtime (here the namespace twin: `install("namespace")`), whose rollout is cut by the task's
lists as verifiers' `resolve_runtime_config` composed them. Pins come from `EGRESS_RESOLVE`.

argv[1]: JSON with `audit`, `commands`, and `tasks` (each `allow`, `block`). Prints one JSON
object: per task, the runtime's class and config lists, the trace's result and each output.
"""

from __future__ import annotations

import asyncio
import json
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


async def main(spec: dict[str, Any]) -> None:
    egress.configure_shared_proxy(audit=spec["audit"])
    install("namespace")
    config = AgentConfig(
        model="scripted", harness=HarnessConfig(id="scripted_harness"), runtime=DockerConfig()
    )
    results = []
    async with Agent(config) as agent:
        for lists in spec["tasks"]:
            scripted_harness.COMMANDS[:] = spec["commands"]
            scripted_harness.OUTPUTS.clear()
            data = TaskData(prompt="fetch", network_allow=lists["allow"],
                            network_block=lists["block"])  # fmt: skip
            task = Task(data)
            async with agent.provision(task) as runtime:
                trace = await agent.run(task, runtime=runtime)
                results.append({
                    "runtime": type(runtime).__name__,
                    "allow": runtime.config.allow,
                    "block": runtime.config.block,
                    "ok": trace.ok,
                    "errors": [str(e) for e in trace.errors],
                    "outputs": list(scripted_harness.OUTPUTS),
                })  # fmt: skip
    print(json.dumps(results))


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))

"""Run verifiers' own `Agent.run` (verifiers 0.4.0) with a scripted harness and no model API,
in the shipped `NamespaceRuntime` (every program in the test's network namespace as `nobody`
without capabilities, the execution boundary `VerifiersBoundary`'s, as in
`EgressDockerRuntime`); run in verifiers' venv by test_verifiers_integration.py.

argv[1]: JSON with `ns`, `setup_url`, `commands`, `audit`, `resolve`, `config` (the
runtime's NetworkPolicyConfig dump). Prints one JSON object.
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
from verifiers.v1.runtimes.subprocess import SubprocessConfig
from verifiers.v1.task import Task, TaskData

import egress
from egress.integrations.verifiers import NamespaceConfig, NamespaceRuntime

PREPARED: list[object] = []


class RecordingRuntime(NamespaceRuntime):
    """The shipped namespace runtime, recording what verifiers' rollout prepares."""

    async def prepare_execution(self, routes: list[str] | None) -> None:
        PREPARED.append(routes)
        await super().prepare_execution(routes)


class FetchTask(Task):
    async def setup(self, runtime: Any) -> None:
        # trusted setup, before the cut: straight to the network
        result = await runtime.run(["curl", "-sS", "--max-time", "5", "-o", "/dev/null",
                                    "-w", "%{http_code}", SPEC["setup_url"]], {})  # fmt: skip
        SEEN_SETUP.append(result.stdout)


SPEC: dict[str, Any] = {}
SEEN_SETUP: list[str] = []


async def main() -> None:
    egress.configure_shared_proxy(audit=SPEC["audit"], resolve=SPEC["resolve"])
    scripted_harness.COMMANDS[:] = SPEC["commands"]
    config = AgentConfig(
        model="scripted", harness=HarnessConfig(id="scripted_harness"), runtime=SubprocessConfig()
    )
    runtime = RecordingRuntime(NamespaceConfig(netns=SPEC["ns"], **SPEC["config"]))
    await runtime.start()
    try:
        async with Agent(config) as agent:
            trace = await agent.run(FetchTask(TaskData(prompt="fetch")), runtime=runtime)
        # verifiers' "reopen for trusted work": released, the cut restored
        await runtime.prepare_execution(None)
        again = SPEC["setup_url"] + "/again"
        reopened = await runtime.run(
            ["curl", "-sS", "--max-time", "5", "-o", "/dev/null", "-w", "%{http_code}", again], {}
        )
    finally:
        await runtime.stop()
    print(json.dumps({
        "ok": trace.ok,
        "errors": [str(e) for e in trace.errors],
        "setup": SEEN_SETUP,
        "outputs": scripted_harness.OUTPUTS,
        "prepared": PREPARED,
        "endpoint": scripted_harness.SEEN.get("endpoint"),
        "reopened": reopened.stdout,
    }))  # fmt: skip


if __name__ == "__main__":
    SPEC.update(json.loads(sys.argv[1]))
    asyncio.run(main())

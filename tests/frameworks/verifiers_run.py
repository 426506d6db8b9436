"""Run verifiers' own `Agent.run` (verifiers 0.4.0) with a scripted harness and no model API,
in a namespace runtime whose execution boundary is `egress.integrations.verifiers`'s
(run in verifiers' venv by test_verifiers_integration.py).

The runtime is verifiers' `SubprocessRuntime` with every program run inside the test's
network namespace as `nobody` without capabilities, and `prepare_execution` /
the process environment delegated to `VerifiersBoundary`: the same object
`EgressDockerRuntime` uses (docker is not what this machine's tests run).

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
from verifiers.v1.configs.runtime import NetworkPolicyConfig
from verifiers.v1.runtimes.subprocess import SubprocessConfig, SubprocessRuntime
from verifiers.v1.task import Task, TaskData

import egress
from egress.integrations.verifiers import VerifiersBoundary

AGENT = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all",
         "--bounding-set=-all", "--"]  # fmt: skip
PREPARED: list[object] = []


class NetnsRuntime(SubprocessRuntime):
    def __init__(self, config: NetworkPolicyConfig, ns: str) -> None:
        super().__init__(SubprocessConfig())
        self.ns = ns
        self.egress = VerifiersBoundary(
            ns, egress.from_verifiers(config), client_id=egress.client_id_from(self.name)
        )

    def _argv(self, argv: list[str], env: dict[str, str]) -> list[str]:
        merged = {**self.process_env(env), **self.egress.env()}
        envargs = [f"{k}={v}" for k, v in merged.items()]
        return ["ip", "netns", "exec", self.ns, "/usr/bin/env", "-i", "PATH=/usr/bin:/bin",
                "HOME=/tmp", *envargs, *AGENT, *argv]  # fmt: skip

    async def run(self, argv: list[str], env: dict[str, str]) -> Any:
        return await super().run(self._argv(argv, env), {})

    async def open_process(self, argv: list[str], env: dict[str, str]) -> Any:
        return await super().open_process(self._argv(argv, env), {})

    async def prepare_execution(self, routes: list[str] | None) -> None:
        PREPARED.append(routes)
        await self.egress.prepare(routes)

    async def teardown(self) -> None:
        await self.egress.release()
        await super().teardown()


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
    runtime = NetnsRuntime(NetworkPolicyConfig(**SPEC["config"]), SPEC["ns"])
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

"""What `EgressDockerRuntime` does without a Docker engine, checked in verifiers' venv
(test_verifiers_integration.py runs it): its policy is `from_verifiers` of verifiers' own
`DockerConfig`, its in-container routes are told apart from host ones, verifiers' network
image question is answered only while our runtime starts, and an exec's command line
carries our proxy environment once prepared. Prints one JSON object."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

from verifiers.v1.configs.runtime import NetworkPolicyConfig
from verifiers.v1.runtimes import container
from verifiers.v1.runtimes import docker as docker_mod
from verifiers.v1.runtimes.docker import DockerConfig
from verifiers.v1.task import TaskData

from egress import from_verifiers
from egress.integrations import verifiers as integration
from egress.integrations.verifiers import EgressDockerRuntime


async def main() -> dict[str, object]:
    out: dict[str, object] = {}
    config = DockerConfig(image="box:latest", allow=["*.pypi.test", "https://files.test"])
    runtime = EgressDockerRuntime(config)
    out["allow"] = [r.text for r in runtime.egress.policy.allow_rules]
    out["default"] = runtime.egress.policy.default
    out["client_id"] = runtime.egress.plan.client_id == runtime.name
    out["target"] = (runtime._container is None, runtime.egress.target)
    runtime._proxy = SimpleNamespace(port=41234)  # verifiers' callback listener's port
    out["split"] = runtime.egress.split_routes([
        "http://127.0.0.1:41234/.vf-host/TOKEN/v1",  # a host callback, served inside
        "http://127.0.0.1:8089/v1",  # a host service: forwarded in
        "https://api.example.test/v1",  # elsewhere: allowed
    ])  # fmt: skip
    # the network-image question, answered by us only while our runtime starts
    seen: list[tuple[str, ...]] = []

    async def fake_cli(*argv: str, **_: object) -> object:
        seen.append(argv)
        return container.ProgramResult(1, "", "no such image")

    integration._cli = fake_cli
    question = ("docker", "image", "inspect", integration._NETWORK_IMAGE)
    outside = await docker_mod.cli(*question)
    token = integration._starting.set(True)
    try:
        inside = await docker_mod.cli(*question)
        other = await docker_mod.cli("docker", "image", "inspect", "box:latest")
    finally:
        integration._starting.reset(token)
    out["image_question"] = [outside.exit_code, inside.exit_code, other.exit_code, len(seen)]
    # an exec's command line before and after prepare
    runtime._container = "vf-test"
    before = runtime._exec({})
    runtime.egress.execution = SimpleNamespace(env={"HTTPS_PROXY": "http://c:t@127.0.0.1:3128"})
    after = runtime._exec({})
    out["exec_env"] = ["HTTPS_PROXY=http://c:t@127.0.0.1:3128" in before,
                       "HTTPS_PROXY=http://c:t@127.0.0.1:3128" in after]  # fmt: skip
    out["background_env"] = runtime._proxy_env() == dict(runtime.egress.plan.env)
    # from_verifiers takes verifiers' own objects too: a config and a TaskData
    task = TaskData(prompt="x", network_allow=["a.pypi.test", "b.test"], network_block=[])
    mapped = from_verifiers(NetworkPolicyConfig(allow=["*.pypi.test"]), task=task)
    alone = from_verifiers(TaskData(prompt="x", network_block=["evil.test"]))
    out["objects"] = [[r.text for r in mapped.allow_rules], [r.text for r in alone.block_rules],
                      alone.default]  # fmt: skip
    return out


print(json.dumps(asyncio.run(main())))

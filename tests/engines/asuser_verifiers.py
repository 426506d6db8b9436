"""verifiers' `EgressDockerRuntime` as a docker-group user (test_unprivileged_engines.py runs
it as the engine run's user, with verifiers' venv): `start()` (its container, online: the
setup; its callback listener on the container's loopback, from the helper), then, told
"cut" on stdin, `prepare_execution([])` (the cut, default cut_mode), then, told "release",
`prepare_execution(None)` (released, restored) and `teardown` once stdin closes. One JSON
line on stdout per step; the first says what this process is (trialprobe.identity).

argv: IMAGE PINS_JSON AUDIT_PATH
"""

from __future__ import annotations

import asyncio
import json
import sys

from trialprobe import identity


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


async def told(word: str) -> None:
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    assert line.strip() == word, line


async def main(image: str, pins: list[str], audit: str) -> None:
    from verifiers.v1.runtimes.docker import DockerConfig

    from egress import configure_shared_proxy
    from egress.integrations.verifiers import EgressDockerRuntime

    configure_shared_proxy(audit=audit, resolve=dict(p.split("=", 1) for p in pins))
    runtime = EgressDockerRuntime(DockerConfig(image=image, allow=["pypi.test"]))
    try:
        try:
            await runtime.start()
        except Exception as exc:
            say(step="start", error=f"{type(exc).__name__}: {exc}", **identity())
            return
        say(step="start", container=runtime._container, **identity())
        await told("cut")
        try:
            await runtime.prepare_execution([])
        except Exception as exc:
            say(step="prepare", error=f"{type(exc).__name__}: {exc}")
            return
        execution = runtime.egress.execution
        assert execution is not None
        say(
            step="prepare",
            cut_mode=execution.cut_mode,
            reason=execution.cut_mode_reason,
            proxy_url=execution.proxy_url,
        )
        await told("release")
        await runtime.prepare_execution(None)
        say(step="release", released=runtime.egress.execution is None, **identity())
        # the container stays until the test closes stdin (it checks the restore first)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    finally:
        await runtime.teardown()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]))

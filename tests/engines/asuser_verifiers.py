"""verifiers' `EgressDockerRuntime` as a docker-group user (test_unprivileged_engines.py runs
it under a real non-root uid, in verifiers' venv): `start()` (its callback listener on the
container's loopback, from the helper), `prepare_execution([])` (the cut, default
cut_mode), then, when told on stdin, `prepare_execution(None)` (released, restored) and
`teardown` once stdin closes. One JSON line on stdout per step.

argv: IMAGE PINS_JSON
"""

from __future__ import annotations

import asyncio
import json
import sys


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


async def main(image: str, pins: list[str]) -> None:
    from verifiers.v1.runtimes.docker import DockerConfig

    from egress import configure_shared_proxy
    from egress.integrations.verifiers import EgressDockerRuntime

    configure_shared_proxy(resolve=dict(p.split("=", 1) for p in pins))
    runtime = EgressDockerRuntime(DockerConfig(image=image, allow=["pypi.test"]))
    try:
        try:
            await runtime.start()
        except Exception as exc:
            say(step="start", error=f"{type(exc).__name__}: {exc}")
            return
        say(step="start", container=runtime._container)
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
        line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        assert line.strip() == "release", line
        await runtime.prepare_execution(None)
        say(step="release", released=runtime.egress.execution is None)
        # the container stays until the test closes stdin (it checks the restore first)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    finally:
        await runtime.teardown()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], json.loads(sys.argv[2])))

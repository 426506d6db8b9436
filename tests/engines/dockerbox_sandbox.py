"""A docker container as an inspect-ai sandbox, for the tests: inspect's own docker sandbox
needs `docker compose`, which the test machines do not have. Commands run with `docker exec`
(inspect's `bash --login -c` becomes the box's `sh -c`: the box is busybox), files go through
`docker exec ... cat`, and `egress_target` names the container for the `egress` sandbox.
The config is the container's name; the test starts and removes the container. Imported by
asuser_inspect.py, in inspect's venv."""

from __future__ import annotations

import subprocess
from typing import Any

import anyio
from inspect_ai.util import (
    ExecResult,
    SandboxConnection,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    sandboxenv,
)


@sandboxenv(name="dockerbox")
class DockerBoxSandboxEnvironment(SandboxEnvironment):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.egress_target = f"docker:{name}"

    @classmethod
    async def sample_init(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, metadata: dict[str, str]
    ) -> dict[str, SandboxEnvironment]:
        assert isinstance(config, str), "the dockerbox sandbox's config is a container name"
        return {"default": cls(config)}

    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        return

    async def exec(
        self,
        cmd: list[str],
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        timeout: int | None = None,
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> ExecResult[str]:
        if cmd[:3] == ["bash", "--login", "-c"]:
            cmd = ["sh", "-c", *cmd[3:]]
        envargs = [a for k, v in (env or {}).items() for a in ("-e", f"{k}={v}")]
        argv = ["docker", "exec", "-i", *envargs, self.name, *cmd]
        data = input.encode() if isinstance(input, str) else input
        with anyio.fail_after(timeout or 60):
            proc = await anyio.run_process(
                argv, input=data, check=False, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
        return ExecResult(
            success=proc.returncode == 0,
            returncode=proc.returncode,
            stdout=proc.stdout.decode(errors="replace"),
            stderr=proc.stderr.decode(errors="replace"),
        )

    async def write_file(self, file: str, contents: str | bytes) -> None:
        await self.exec(["sh", "-c", 'cat > "$0"', file], input=contents)

    async def read_file(self, file: str, text: bool = True) -> Any:
        done = await self.exec(["cat", file])
        return done.stdout if text else done.stdout.encode()

    async def connection(self, *, user: str | None = None) -> SandboxConnection:
        return SandboxConnection(type="docker", command=f"docker exec -it {self.name} sh")

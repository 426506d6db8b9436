"""A namespace sandbox for inspect-ai, for the tests: inspect's docker sandbox needs Docker
Engine >= 24.0.6 and Debian 12's is 20.10 (docs/integrations.md#inspect-ai).

The sandbox is a network namespace that the test made (its name is the sandbox's config);
commands run in it as `nobody` without capabilities, files live on this host (a working
directory of the sample's own), and `egress_target` tells the `egress` sandbox what to cut.
Imported by the script that runs inspect (`inspect_run.py`), in inspect's venv.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from typing import Any

import anyio
from inspect_ai.util import (
    ExecResult,
    SandboxConnection,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    sandboxenv,
)

AGENT = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all",
         "--bounding-set=-all", "--"]  # fmt: skip


@sandboxenv(name="netns")
class NetnsSandboxEnvironment(SandboxEnvironment):
    def __init__(self, ns: str, workdir: str) -> None:
        super().__init__()
        self.ns = ns
        self.workdir = workdir
        self.egress_target = ns

    @classmethod
    async def sample_init(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, metadata: dict[str, str]
    ) -> dict[str, SandboxEnvironment]:
        assert isinstance(config, str), "the netns sandbox's config is a namespace name"
        workdir = tempfile.mkdtemp(prefix="egress-inspect-")
        os.chmod(workdir, 0o777)
        return {"default": cls(config, workdir)}

    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        for env in environments.values():
            shutil.rmtree(env.workdir, ignore_errors=True)  # type: ignore[attr-defined]

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
        envargs = [f"{k}={v}" for k, v in (env or {}).items()]
        argv = ["ip", "netns", "exec", self.ns, "/usr/bin/env", "-i", "PATH=/usr/bin:/bin",
                "HOME=/tmp", *envargs, *AGENT, *cmd]  # fmt: skip
        data = input.encode() if isinstance(input, str) else input
        with anyio.fail_after(timeout or 60):
            proc = await anyio.run_process(
                argv, input=data, cwd=os.path.join(self.workdir, cwd or ""), check=False,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            )  # fmt: skip
        return ExecResult(
            success=proc.returncode == 0,
            returncode=proc.returncode,
            stdout=proc.stdout.decode(errors="replace"),
            stderr=proc.stderr.decode(errors="replace"),
        )

    def _path(self, file: str) -> str:
        return file if os.path.isabs(file) else os.path.join(self.workdir, file)

    async def write_file(self, file: str, contents: str | bytes) -> None:
        path = self._path(file)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(contents.encode() if isinstance(contents, str) else contents)
        os.chmod(path, 0o755)

    async def read_file(self, file: str, text: bool = True) -> Any:
        with open(self._path(file), "rb") as fh:
            data = fh.read()
        return data.decode() if text else data

    async def connection(self, *, user: str | None = None) -> SandboxConnection:
        return SandboxConnection(type="netns", command=f"ip netns exec {self.ns} bash")

"""inspect-harbor: Harbor tasks run by inspect-ai, with their network policy enforced
(docs/integrations.md#harbor-tasks-through-inspect-harbor).

inspect-harbor 1.0 turns a Harbor task into an inspect sample whose sandbox is
`(sandbox_env_name, ComposeConfig)` and whose metadata carries the task's config
(`harbor_config`). Given `sandbox_env_name="egress"`, egress's sandbox receives that compose
config (`egress.integrations.inspect` hands it here) and runs the task as Harbor's
`egress-docker` environment does:

- the phases come from `harbor_config` as Harbor resolves them (`harbor_phases`): the
  `[environment]` baseline from start, the agent phase from inspect's `on_sample_start` hook
  (before the solver), the verifier phase from its `on_sample_scoring` hook (before the
  scorer); each maps through `from_harbor` (`HarborEgress`, transparent: tools need no proxy
  settings, every port of each entry, as Harbor's sidecar);
- when some phase is restricted, every compose service runs in one network namespace held by
  an idle `egress-netns` service (`police_compose`), and that namespace is cut: every service
  is behind the policy, reaching the others on `localhost`; what would take a service out of
  it is refused by name (`HarborTaskError`) before anything starts;
- the project runs with Docker Compose v2 (`docker compose up --wait`, as inspect's docker
  sandbox does) against the engine of `DOCKER_HOST`; commands run with `docker exec`.

A compose config without a `harbor_config` in the sample's metadata is refused: there is no
policy to enforce (wrap inspect's own sandboxes with `EgressSandboxConfig` instead).
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import secrets
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from inspect_ai.hooks import Hooks, SampleScoring, SampleStart, hooks
from inspect_ai.util import (
    ExecResult,
    OutputLimitExceededError,
    SandboxConnection,
    SandboxEnvironment,
    SandboxEnvironmentLimits,
)
from inspect_ai.util import subprocess as inspect_subprocess

from netcut.helper.session import default_image

from ..boundary.plan import client_id_from
from .hb_policy import (
    NETNS_SERVICE,
    HarborEgress,
    HarborPhases,
    HarborTaskError,
    ensure_image,
    harbor_phases,
    phase_policy,
    police_compose,
)

ENGINE = "docker"
# how long `docker compose up --wait` may take (an image build included)
UP_TIMEOUT = 1800.0
_MISSING, _DIRECTORY = 44, 45


class HarborProject:
    """One sample's compose project and its policy: brought up by `start`, switched per
    phase by `enter`, taken down (containers and volumes) by `stop`."""

    def __init__(self, task_name: str, project: Mapping[str, Any], metadata: Mapping[str, Any]):
        self.phases: HarborPhases = harbor_phases(metadata.get("harbor_config") or {})
        for policy in (self.phases.baseline, self.phases.agent, self.phases.verifier):
            phase_policy(policy)  # PolicyError now, before anything starts
        # the compose project to run: every service behind the holder, or HarborTaskError now
        self.image = default_image() if self.phases.restricted else None
        self.project = police_compose(project, self.image) if self.image else dict(project)
        self.name = f"egress-ih-{secrets.token_hex(5)}"
        self.client_id = client_id_from(task_name, metadata.get("__sample_id__", ""), self.name)
        self.directory = Path(tempfile.mkdtemp(prefix=f"{self.name}-"))
        self.containers: dict[str, str] = {}
        self.egress: HarborEgress | None = None
        self.current: dict[str, object] | None = None

    async def start(self) -> None:
        """Up, then the baseline (as Harbor enforces its startup policy once the environment
        is up: the image build ran online)."""
        if self.image is not None:
            await asyncio.to_thread(ensure_image, ENGINE, self.image)
        path = self.directory / "compose.json"
        path.write_text(json.dumps(self.project, indent=2))
        await self.compose("up", "--detach", "--build", "--wait", limit=UP_TIMEOUT)
        for service in [*self.project["services"]]:
            found = await self.compose("ps", "--quiet", service)
            self.containers[service] = found.strip().splitlines()[0]
        if self.phases.restricted:
            self.egress = HarborEgress(f"docker:{self.containers[NETNS_SERVICE]}", self.client_id)
        await self.enter(self.phases.baseline)

    async def enter(self, policy: dict[str, object]) -> None:
        """Switch to `policy` (nothing when it is the one in force, as Harbor's
        `set_network_policy`). A failure leaves the sandbox cut (fail closed)."""
        if policy == self.current:
            return
        if self.egress is not None:
            await self.egress.apply(policy)
        self.current = policy

    async def stop(self) -> None:
        try:
            if self.egress is not None:
                await self.egress.close()
        finally:
            try:
                if (self.directory / "compose.json").exists():  # else nothing was started
                    await self.compose("down", "--volumes", "--remove-orphans", "--timeout", "1")
            finally:
                shutil.rmtree(self.directory, ignore_errors=True)

    async def compose(self, *args: str, limit: float = 300.0) -> str:
        argv = [ENGINE, "compose", "-p", self.name, "-f", str(self.directory / "compose.json")]
        done = await _run([*argv, *args], limit=limit)
        if done.returncode != 0:
            raise HarborTaskError(
                f"`docker compose {' '.join(args)}` failed ({done.returncode}): "
                f"{done.stderr.strip()[-2000:]} (Docker Compose v2 is needed: `docker compose "
                "version`, docs/integrations.md#harbor-tasks-through-inspect-harbor)"
            )
        out: str = done.stdout
        return out


class HarborServiceSandbox(SandboxEnvironment):  # type: ignore[misc]
    """One compose service of a Harbor sample, as inspect sees it (`sandbox(name)`)."""

    def __init__(self, project: HarborProject, service: str) -> None:
        super().__init__()
        self.project = project
        self.service = service

    @property
    def container(self) -> str:
        return self.project.containers[self.service]

    # inspect calls these on the registered `egress` sandbox, which hands them to the module
    # functions below; they are here because inspect's base class declares them abstract
    @classmethod
    async def sample_init(
        cls, task_name: str, config: Any, metadata: dict[str, str]
    ) -> dict[str, SandboxEnvironment]:
        return await sample_init(task_name, config, metadata)

    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: Any,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        await sample_cleanup(environments)

    # framework-signature: inspect_ai.util.SandboxEnvironment.exec
    async def exec(
        self,
        cmd: list[str],
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        timeout: int | None = None,  # noqa: ASYNC109 (inspect's signature)
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> ExecResult[str]:
        argv = [ENGINE, "exec", "-i"]
        if cwd:
            argv += ["-w", cwd]
        if user:
            argv += ["-u", user]
        for key, value in (env or {}).items():
            argv += ["-e", f"{key}={value}"]
        # inspect's own subprocess: its timeout (TimeoutError) and its output limit, so a
        # command that prints without end cannot fill this process's memory
        result: ExecResult[str] = await _inspect(
            [*argv, self.container, *cmd],
            input=input,
            timeout=timeout,
            output_limit=SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE,
            concurrency=concurrency,
        )
        return result

    async def write_file(self, file: str, contents: str | bytes) -> None:
        data = contents.encode() if isinstance(contents, str) else contents
        script = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
        done = await self.exec(["sh", "-c", script, "sh", file], input=data)
        if done.returncode != 0:
            raise PermissionError(f"{self.service}: cannot write {file}: {done.stderr.strip()}")

    async def read_file(self, file: str, text: bool = True) -> Any:
        script = f'[ -e "$1" ] || exit {_MISSING}; [ -d "$1" ] && exit {_DIRECTORY}; cat -- "$1"'
        limit = SandboxEnvironmentLimits.MAX_READ_FILE_SIZE
        done = await _inspect(
            [ENGINE, "exec", self.container, "sh", "-c", script, "sh", file],
            text=False,
            output_limit=limit + 1,
        )
        if done.returncode == _MISSING:
            raise FileNotFoundError(f"{self.service}: no such file: {file}")
        if done.returncode == _DIRECTORY:
            raise IsADirectoryError(f"{self.service}: a directory: {file}")
        if done.returncode != 0:
            why = done.stderr.decode(errors="replace").strip()
            raise PermissionError(f"{self.service}: cannot read {file}: {why}")
        if len(done.stdout) > limit:
            raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, None)
        return done.stdout.decode() if text else done.stdout

    async def connection(self, *, user: str | None = None) -> SandboxConnection:
        who = f"-u {user} " if user else ""
        return SandboxConnection(
            type="docker",
            command=f"docker exec -it {who}{self.container} bash -l",
            container=self.container,
        )


# the samples' projects waiting for their phase hooks (a sample's sample_init, hooks and
# cleanup all run in its one task)
_projects: contextvars.ContextVar[list[HarborProject]] = contextvars.ContextVar(
    "egress_inspect_harbor_projects"
)


async def sample_init(
    task_name: str, config: Any, metadata: Mapping[str, Any]
) -> dict[str, SandboxEnvironment]:
    """The sample's services, up and under the baseline; the default service first
    (inspect-harbor's and inspect's rule: `x-default`, else `default` or `main`, else the
    first). Raises `HarborTaskError` (no `harbor_config`, or a key egress cannot honour) or
    `PolicyError` before anything starts."""
    if not isinstance(metadata.get("harbor_config"), Mapping):
        raise HarborTaskError(
            "the egress sandbox runs a compose config only for a Harbor task: the sample's "
            "metadata has no `harbor_config` (inspect-harbor sets it); for another compose "
            "project wrap inspect's sandbox with EgressSandboxConfig(inner=..., inner_config=...) "
            "(docs/integrations.md#inspect-ai)"
        )
    source = config.model_dump(mode="json", by_alias=True, exclude_none=True)
    project = HarborProject(task_name, source, metadata)
    services = list(source["services"])
    default = _default_service(source["services"])
    ordered = [default, *(s for s in services if s != default)]
    try:
        await project.start()
        sandboxes = {s: HarborServiceSandbox(project, s) for s in ordered}
    except BaseException:
        await project.stop()
        raise
    _projects.set([*_projects.get([]), project])
    return dict(sandboxes)


async def sample_cleanup(environments: Mapping[str, SandboxEnvironment]) -> None:
    boxes = [e for e in environments.values() if isinstance(e, HarborServiceSandbox)]
    projects = {id(box.project): box.project for box in boxes}
    _projects.set([p for p in _projects.get([]) if id(p) not in projects])
    for project in projects.values():
        await project.stop()


def _default_service(services: Mapping[str, Any]) -> str:
    for name, service in services.items():
        if isinstance(service, Mapping) and service.get("x-default"):
            return str(name)
    for name in ("default", "main"):
        if name in services:
            return name
    return str(next(iter(services)))


@hooks(name="egress_harbor_phases", description="egress-netcut: Harbor task phases in inspect")
class HarborPhaseHooks(Hooks):  # type: ignore[misc]
    """The agent phase before the solver, the verifier phase before the scorer."""

    async def on_sample_start(self, data: SampleStart) -> None:
        for project in _projects.get([]):
            await project.enter(project.phases.agent)

    async def on_sample_scoring(self, data: SampleScoring) -> None:
        for project in _projects.get([]):
            await project.enter(project.phases.verifier)


async def _inspect(argv: list[str], **kwargs: Any) -> Any:
    """inspect's `subprocess` (its timeout and output limit), `HarborTaskError` when the
    Docker CLI is not there."""
    try:
        return await inspect_subprocess(argv, **kwargs)
    except FileNotFoundError as exc:
        raise HarborTaskError(
            f"{argv[0]}: not found on PATH (the Docker CLI with Compose v2 runs Harbor tasks, "
            "docs/integrations.md#harbor-tasks-through-inspect-harbor)"
        ) from exc


async def _run(
    argv: list[str], data: bytes | None = None, limit: float | None = None
) -> ExecResult[str]:
    """`argv`'s result; `TimeoutError` after `limit` seconds (the client is killed), as
    inspect's sandboxes raise it."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if data is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    except FileNotFoundError as exc:
        raise HarborTaskError(
            f"{argv[0]}: not found on PATH (the Docker CLI with Compose v2 runs Harbor tasks, "
            "docs/integrations.md#harbor-tasks-through-inspect-harbor)"
        ) from exc
    try:
        out, err = await asyncio.wait_for(proc.communicate(data), limit)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise TimeoutError(f"{argv[0]} {argv[1]}: no result within {limit} s") from None
    code = proc.returncode if proc.returncode is not None else -1
    return ExecResult(
        success=code == 0,
        returncode=code,
        stdout=out.decode(errors="replace"),
        stderr=err.decode(errors="replace"),
    )


__all__ = ["HarborPhaseHooks", "HarborProject", "HarborServiceSandbox"]

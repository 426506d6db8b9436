"""inspect-ai: the `egress` sandbox, which wraps another sandbox and puts it behind the proxy
(docs/integrations.md#inspect-ai).

Registered through inspect's `inspect_ai` entry point (this package's pyproject), so after
`pip install 'egress-netcut[inspect]'` a task names it like any other sandbox::

    Task(..., sandbox=("egress", EgressSandboxConfig(inner="docker", inner_config="compose.yaml",
                                                      allow=["pypi.org"])))

The sample's life, in inspect's order:

1. `sample_init`: the inner sandbox is created as usual; nothing is cut yet, so inspect's
   own setup (files, the sample's `setup` script) runs online, without proxy settings.
2. inspect's `on_sample_start` hook (after setup, before the solver): every egress sandbox
   of the sample is prepared (`prepare_execution` on the shared proxy, client id from the
   sample's id, epoch and uuid) and cut. With `cut="sample_init"` this happens in step 1
   instead, before setup. inspect logs and ignores a hook's exception, so the sandbox
   itself is fail-closed: after a failed cut every `exec` raises `ExecutionNotReady` (not
   `SandboxUnavailableError`, which a tool would hand the model as output), and the sample
   fails with it.
3. Every `exec` gets the proxy environment (`HTTP(S)_PROXY`, `NO_PROXY`, both cases) under
   whatever `env` the caller passed: inspect's tools (`bash()`, `python()`) pass none.
4. `sample_cleanup`: the sandbox is released (cut undone) and the inner one cleaned up.

Given a Harbor task's `ComposeConfig` instead (inspect-harbor's `sandbox_env_name="egress"`),
every step goes to `egress.integrations.hb_inspect`, which runs the task's compose
project behind the policy of the sample's `harbor_config`, per phase
(docs/integrations.md#harbor-tasks-through-inspect-harbor).

inspect is imported here only, and only when this module is imported (the entry point does
that when inspect starts).
"""

from __future__ import annotations

import contextvars
import secrets
from dataclasses import replace
from typing import Any, Literal

from inspect_ai.hooks import Hooks, SampleStart, hooks
from inspect_ai.util import (
    ComposeConfig,
    ExecResult,
    SandboxConnection,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    sandboxenv,
)
from inspect_ai.util._sandbox.registry import registry_find_sandboxenv
from pydantic import BaseModel, ConfigDict

from ..boundary import Execution, ExecutionNotReady, prepare_execution, release_execution
from ..boundary.plan import client_id_from
from ..config import parse_resolve
from ..policy.compose import compose
from ..policy.rules import Policy
from .shared import EvaluatorFile, load_evaluator, shared_proxy


class EgressSandboxConfig(BaseModel):  # type: ignore[misc]
    """The `egress` sandbox's configuration: the sandbox it wraps, and the policy. Frozen,
    with tuples for lists: inspect hashes a sandbox's configuration."""

    model_config = ConfigDict(frozen=True)

    inner: str = "docker"
    """The wrapped sandbox's type (`docker`, `local`, any registered one)."""
    inner_config: Any = None
    """The wrapped sandbox's own configuration (a file name, or its config model/dict)."""
    allow: tuple[str, ...] = ()
    block: tuple[str, ...] = ()
    default: Literal["deny", "allow"] = "deny"
    framework_routes: tuple[str, ...] = ()
    """Host services the agent reaches without the proxy (forwarded inside the sandbox)."""
    transparent: bool = False
    """Also judge tools that ignore proxy settings (docs/proxy.md#transparent-mode-and-socks5)."""
    cut: Literal["sample_start", "sample_init"] = "sample_start"
    """`sample_start`: after inspect's setup (online), before the solver; `sample_init`:
    before setup too."""
    proxy_port: int = 3128
    allow_privileged: bool = False
    mode: Literal["loopback", "gateway"] = "loopback"
    """Where the sandbox reaches the proxy: its own loopback, or the host side of its
    bridge (docs/user-guide.md#sandbox-lifecycle)."""
    cut_mode: Literal["auto", "direct", "helper"] = "auto"
    """How the sandbox is cut: `auto` chooses the helper when this process cannot enter
    namespaces (a docker-group user), else direct mode (docs/user-guide.md#helper-mode)."""
    helper_image: str | None = None
    """netcut's helper image (default: assembled offline from this host's files)."""
    policy_file: str | None = None
    """An evaluator policy file (docs/integrations.md#the-evaluator-file), composed over
    `allow` / `block` / `default` (`egress.compose`: the task's lists can only narrow it);
    its `resolve` pins and reserved ranges are added to the shared proxy."""
    resolve: tuple[str, ...] = ()
    """Pinned names, `NAME=ADDR`, added to the shared proxy (a clash is an error)."""

    def policy(self) -> Policy:
        """The sample's policy: the lists, under the evaluator file if there is one."""
        task = Policy(allow=self.allow, block=self.block, default=self.default)
        file = self.evaluator()
        return compose(file.policy, task) if file is not None else task

    def evaluator(self) -> EvaluatorFile | None:
        """The policy file with this config's own pins added (`PolicyError` as
        `load_evaluator`, or for a malformed pin)."""
        file = load_evaluator(self.policy_file, "policy_file")
        pins = parse_resolve(list(self.resolve), "EgressSandboxConfig resolve")
        if not pins:
            return file
        if file is None:
            return EvaluatorFile(Policy(default="allow"), pins)
        return replace(file, pins={**file.pins, **pins})


# the sample's egress sandboxes waiting for the sample-start hook (a sample runs in one task,
# and sample_init and the hook both run in it)
_pending: contextvars.ContextVar[list[EgressSandboxEnvironment]] = contextvars.ContextVar(
    "egress_inspect_pending"
)


@sandboxenv(name="egress")
class EgressSandboxEnvironment(SandboxEnvironment):  # type: ignore[misc]
    """Another sandbox, cut and behind the shared proxy once the solver starts."""

    def __init__(self, inner: SandboxEnvironment, name: str, config: EgressSandboxConfig):
        super().__init__()
        self.inner = inner
        self.name = name
        self.config = config
        self.execution: Execution | None = None
        self.failure: str | None = None
        self.failure_kind: Any = "other"

    # --- the lifecycle ---------------------------------------------------------------------

    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        if "services" in config:  # a Harbor task's compose config (inspect-harbor)
            return ComposeConfig(**config)
        return EgressSandboxConfig(**config)

    @classmethod
    async def task_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None) -> None:
        if isinstance(config, ComposeConfig):
            return  # a Harbor task: nothing per task (hb_inspect.sample_init)
        cfg = _config(config)
        await registry_find_sandboxenv(cfg.inner).task_init(task_name, cfg.inner_config)

    @classmethod
    async def task_init_environment(
        cls, config: SandboxEnvironmentConfigType | None, metadata: dict[str, str]
    ) -> dict[str, str]:
        if isinstance(config, ComposeConfig):
            return {}
        cfg = _config(config)
        inner = registry_find_sandboxenv(cfg.inner)
        env: dict[str, str] = await inner.task_init_environment(cfg.inner_config, metadata)
        return env

    @classmethod
    async def sample_init(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        metadata: dict[str, str],
    ) -> dict[str, SandboxEnvironment]:
        if isinstance(config, ComposeConfig):
            return await hb_inspect.sample_init(task_name, config, metadata)
        cfg = _config(config)
        inner = registry_find_sandboxenv(cfg.inner)
        envs = await inner.sample_init(task_name, cfg.inner_config, metadata)
        wrapped = {name: cls(env, name, cfg) for name, env in envs.items()}
        if cfg.cut == "sample_init":
            run = secrets.token_hex(4)  # no sample id yet: one per sample_init
            for env in wrapped.values():
                await env.cut(client_id_from(task_name, run, env.name), fail=True)
        else:
            _pending.set([*_pending.get([]), *wrapped.values()])
        return dict(wrapped)

    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        if isinstance(config, ComposeConfig):
            await hb_inspect.sample_cleanup(environments)
            return
        cfg = _config(config)
        inner_envs: dict[str, SandboxEnvironment] = {}
        errors: list[BaseException] = []
        for name, env in environments.items():
            if not isinstance(env, EgressSandboxEnvironment):
                inner_envs[name] = env
                continue
            inner_envs[name] = env.inner
            try:
                await env.release()
            except Exception as exc:  # the inner sandbox is cleaned up whatever happens
                errors.append(exc)
        pending = _pending.get([])
        _pending.set([e for e in pending if e not in environments.values()])
        await registry_find_sandboxenv(cfg.inner).sample_cleanup(
            task_name, cfg.inner_config, inner_envs, interrupted
        )
        if errors:
            raise errors[0]

    @classmethod
    async def task_cleanup(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, cleanup: bool
    ) -> None:
        if isinstance(config, ComposeConfig):
            return
        cfg = _config(config)
        await registry_find_sandboxenv(cfg.inner).task_cleanup(task_name, cfg.inner_config, cleanup)

    async def cut(self, client_id: str, *, fail: bool = False) -> None:
        """Prepare this sandbox on the loop's shared proxy (and so cut it). A failure makes
        every later `exec` raise; with `fail` it is raised here too."""
        try:
            target = await _target(self.inner)
            proxy = await shared_proxy()
            file = self.config.evaluator()
            if file is not None:
                file.apply_to(proxy)
            self.execution = await prepare_execution(
                target,
                self.config.policy(),
                proxy,
                framework_routes=self.config.framework_routes,
                client_id=client_id,
                proxy_port=self.config.proxy_port,
                transparent=self.config.transparent,
                allow_privileged=self.config.allow_privileged,
                mode=self.config.mode,
                cut_mode=self.config.cut_mode,
                helper_image=self.config.helper_image,
            )
        except Exception as exc:
            self.failure = f"egress: sandbox {self.name!r} could not be cut: {exc}"
            self.failure_kind = getattr(exc, "kind", "other")
            if fail:
                raise
            raise ExecutionNotReady(self.failure, self.failure_kind) from exc

    async def release(self) -> None:
        if self.execution is not None:
            execution, self.execution = self.execution, None
            await release_execution(await shared_proxy(), execution, restore=True)

    # --- what the solver and tools call -----------------------------------------------------

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
        if self.failure is not None:
            # not SandboxUnavailableError, which a tool reports to the model as its output:
            # the sample itself must fail
            raise ExecutionNotReady(self.failure, self.failure_kind)
        if self.execution is not None:
            env = {**self.execution.env, **(env or {})}
        result: ExecResult[str] = await self.inner.exec(
            cmd, input, cwd, env, user, timeout, timeout_retry, concurrency
        )
        return result

    async def write_file(self, file: str, contents: str | bytes) -> None:
        await self.inner.write_file(file, contents)

    async def read_file(self, file: str, text: bool = True) -> Any:
        return await self.inner.read_file(file, text)

    async def connection(self, *, user: str | None = None) -> SandboxConnection:
        return await self.inner.connection(user=user)

    def default_polling_interval(self) -> float:
        interval: float = self.inner.default_polling_interval()
        return interval


@hooks(name="egress_cut", description="egress-netcut: cut egress sandboxes before the solver")
class EgressCutHook(Hooks):  # type: ignore[misc]
    """Cuts the sample's `egress` sandboxes once inspect's setup is done."""

    async def on_sample_start(self, data: SampleStart) -> None:
        pending = _pending.get([])
        _pending.set([])
        summary = data.summary
        for env in pending:
            cid = client_id_from(summary.id, summary.epoch, data.sample_id, env.name)
            await env.cut(cid)


def _config(config: SandboxEnvironmentConfigType | None) -> EgressSandboxConfig:
    if isinstance(config, EgressSandboxConfig):
        return config
    if config is None:
        return EgressSandboxConfig()
    if isinstance(config, dict):
        return EgressSandboxConfig(**config)
    raise TypeError(
        f"the egress sandbox takes an EgressSandboxConfig (or, from inspect-harbor, a Harbor "
        f"task's ComposeConfig), not {type(config).__name__} (docs/integrations.md#inspect-ai)"
    )


async def _target(inner: SandboxEnvironment) -> str:
    """The network namespace to cut: the inner sandbox's `egress_target` (a namespace name,
    path, PID or `docker:ID`, for a sandbox of one's own), else its docker or podman
    container from `connection()`."""
    target = getattr(inner, "egress_target", None)
    if isinstance(target, str):
        return target
    conn = await inner.connection()
    if conn.type in ("docker", "podman") and conn.container:
        return f"{conn.type}:{conn.container}"
    raise ExecutionNotReady(
        f"egress: cannot find the network namespace of a {type(inner).__name__} "
        f"(connection type {conn.type!r}); give it an `egress_target` attribute",
        "not_found",
    )


# the namespace sandbox (`egress-netns`) registers itself with inspect on import, and the
# Harbor phases' hooks theirs
from . import hb_inspect  # noqa: E402
from . import netns_sandbox as _netns_sandbox  # noqa: E402, F401

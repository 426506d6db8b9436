"""verifiers 0.4: a docker runtime whose execution policy is ours (docs/integrations.md#verifiers).

verifiers' rollout calls `Runtime.prepare_execution(routes)` after setup, right before the
agent starts (`routes` are the interception and tool URLs the agent must keep reaching), and
`prepare_execution(None)` to reopen the box for more trusted work. `EgressDockerRuntime` is
verifiers' `DockerRuntime` with that hook, and the cut, replaced:

- `prepare_execution(routes)`: the container is prepared on the loop's shared proxy
  (`prepare_execution` in egress: its own proxy listener on the container's loopback, the
  netlink cut, the probe), under `from_verifiers(config)` — verifiers' own allow/block
  semantics — plus the routes. verifiers' in-container routes (host callbacks, served by
  its listener on the container's loopback) are left alone, not forwarded again; any other
  route is allowed as a framework route. verifiers' own proxy is narrowed to those routes.
- `prepare_execution(None)`: released, with the cut restored.
- Every exec (and a background server started during setup, by the planned environment)
  gets our proxy environment.
- No image is pulled: verifiers' alpine/iptables helper is not needed for the cut, and its
  in-container listener is opened with `setns` (root) or, for a docker-group user, by
  netcut's offline-built helper, which passes it back over a unix socket like verifiers'
  own python helper does (docs/user-guide.md#helper-mode). `cut_mode` (default "auto")
  chooses as `prepare_execution` does.

`VerifiersBoundary` is that logic on its own, for a runtime of one's own (the tests run a
namespace runtime with it). verifiers is imported only here.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import socket
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any
from urllib.parse import urlsplit

from verifiers.v1.configs.runtime import NetworkPolicyConfig
from verifiers.v1.runtimes import container as _container_mod
from verifiers.v1.runtimes import docker as _docker_mod
from verifiers.v1.runtimes.docker import DockerRuntime
from verifiers.v1.runtimes.docker.egress import NetworkPolicy

from netcut.helper.listeners import ListenSpec
from netcut.targetref import parse_target

from ..boundary import CutModeChoice, Execution, prepare_execution, release_execution
from ..boundary.checks import cut_mode_for
from ..boundary.passing import listen_in_sandbox
from ..boundary.plan import ExecutionPlan, client_id_from, plan_execution
from ..policy.rules import Policy
from ..policy.verifiers import from_verifiers
from ..proxy.net.netns import listen_in_netns, namespace_path
from .shared import shared_proxy

ANY_CONNECT_PORT_ENV = "EGRESS_VERIFIERS_ANY_CONNECT_PORT"


def runtime_policy(config: Any, any_connect_port: bool | None = None) -> Policy:
    """`from_verifiers(config)` for a runtime. `any_connect_port` None reads
    `$EGRESS_VERIFIERS_ANY_CONNECT_PORT` (`1` opts in), so a verifiers CLI run, which builds
    the runtime from its config, can choose it too; anything but `0`, `1` or unset is a
    `ValueError` (a typo must not silently keep, or widen, the policy)."""
    if any_connect_port is None:
        raw = os.environ.get(ANY_CONNECT_PORT_ENV, "").strip()
        if raw not in ("", "0", "1"):
            raise ValueError(f"{ANY_CONNECT_PORT_ENV} must be 0 or 1, not {raw!r}")
        any_connect_port = raw == "1"
    return from_verifiers(config, any_connect_port=any_connect_port)


class VerifiersBoundary:
    """One verifiers runtime's execution boundary: `prepare(routes)` and `env()`.

    `target` is the namespace to cut (a name, path, PID or `docker:ID`), or a function that
    returns it once the box exists; `policy` the agent's (default: `from_verifiers(config)`).
    `in_sandbox(url)` says which routes the box serves itself (left alone); every other
    route is allowed as a framework route, and one on the host's loopback is forwarded into
    the box at the same port (`framework_urls`, docs/proxy.md#listening-inside-a-namespace-
    framework-route-forwarders). `client_id` names the runtime in the audit log."""

    def __init__(
        self,
        target: str | Callable[[], str],
        policy: Policy,
        *,
        client_id: str,
        in_sandbox: Callable[[str], bool] = lambda url: False,
        transparent: bool = False,
        proxy_port: int = 3128,
        cut_mode: CutModeChoice = "auto",
        helper_image: str | None = None,
    ) -> None:
        self._target = target
        self.policy = policy
        self.in_sandbox = in_sandbox
        self.transparent = transparent
        self.cut_mode: CutModeChoice = cut_mode
        self.helper_image = helper_image
        self.plan: ExecutionPlan = plan_execution(client_id, proxy_port=proxy_port)
        self.execution: Execution | None = None

    @property
    def target(self) -> str:
        return self._target if isinstance(self._target, str) else self._target()

    async def prepare(self, routes: list[str] | None) -> None:
        """verifiers' `prepare_execution(routes)`: cut (or re-cut with new routes) for the
        agent; None releases and restores the box for trusted work."""
        if routes is None:
            await self.release()
            return
        forwarded, allowed = self.split_routes(routes)
        policy = Policy(
            allow=self.policy.allow_rules,
            block=self.policy.block_rules,
            default=self.policy.default,
            framework_routes=[*self.policy.framework_routes, *allowed],
            resolve_names_for_address_rules=self.policy.resolve_names_for_address_rules,
        )
        self.execution = await prepare_execution(
            self.target,
            policy,
            await shared_proxy(),
            framework_routes=forwarded,
            client_id=self.plan.client_id,
            token=self.plan.token,
            proxy_port=self.plan.proxy_port,
            transparent=self.transparent,
            cut_mode=self.cut_mode,
            helper_image=self.helper_image,
        )

    def split_routes(self, routes: Iterable[str]) -> tuple[list[str], list[str]]:
        """(routes on the host's loopback, to forward into the box; other routes to allow),
        without the ones the box serves itself. A route is reduced to its origin."""
        forwarded: list[str] = []
        allowed: list[str] = []
        for url in routes:
            if self.in_sandbox(url):
                continue
            parts = urlsplit(url)
            origin = parts._replace(path="", query="", fragment="").geturl()
            host = (parts.hostname or "").lower()
            loopback = host in ("localhost", "::1") or host.startswith("127.")
            (forwarded if loopback else allowed).append(origin)
        return list(dict.fromkeys(forwarded)), list(dict.fromkeys(allowed))

    def env(self) -> dict[str, str]:
        """The agent's proxy environment once prepared, else {}."""
        return dict(self.execution.env) if self.execution is not None else {}

    async def release(self) -> None:
        if self.execution is not None:
            execution, self.execution = self.execution, None
            await release_execution(await shared_proxy(), execution, restore=True)


# verifiers' start() builds an alpine image with iptables for its own cut (a registry pull)
# when the policy is restricted; ours needs none, so while our runtime starts, the question
# "is that image there?" is answered yes. Scoped to our runtimes' start by a ContextVar.
_starting = contextvars.ContextVar("egress_verifiers_starting", default=False)
_NETWORK_IMAGE: str = getattr(_docker_mod, "_NETWORK_IMAGE", "localhost/verifiers-network:1")
_cli = _container_mod.cli


async def _cli_shim(*argv: str, **kwargs: Any) -> Any:
    if _starting.get() and argv[1:] == ("image", "inspect", _NETWORK_IMAGE):
        return _container_mod.ProgramResult(0, "[]", "")
    return await _cli(*argv, **kwargs)


_docker_mod.cli = _cli_shim


class EgressDockerRuntime(DockerRuntime):  # type: ignore[misc]
    """verifiers' docker runtime with egress-netcut's proxy and cut (module docstring).

    Takes the same `DockerConfig`; `policy` overrides `from_verifiers(config)`. The audit's
    client id is the runtime's name (verifiers' `vf-…`). `any_connect_port` (default:
    `$EGRESS_VERIFIERS_ANY_CONNECT_PORT` = 1) is `from_verifiers`'s widening opt-in: a rule
    without a port allows CONNECT to every port, as `NetworkPolicyConfig.permits` alone
    (verifiers' own proxy allows CONNECT to 443 only; docs/policy.md#verifiers)."""

    def __init__(
        self,
        config: Any,
        name: str | None = None,
        *,
        host: Any = None,
        policy: Policy | None = None,
        transparent: bool = False,
        cut_mode: CutModeChoice = "auto",
        helper_image: str | None = None,
        any_connect_port: bool | None = None,
    ) -> None:
        super().__init__(config, name, host=host)
        chosen = policy if policy is not None else runtime_policy(config, any_connect_port)
        self.egress = VerifiersBoundary(
            lambda: f"{self.engine}:{self._container}",
            chosen,
            client_id=client_id_from(self.name),
            in_sandbox=self._served_inside,
            transparent=transparent,
            cut_mode=cut_mode,
            helper_image=helper_image,
        )

    async def start(self) -> None:
        token = _starting.set(True)
        try:
            await super().start()
        finally:
            _starting.reset(token)

    async def _container_listener(self) -> socket.socket:
        """verifiers' callback listener on the container's loopback: opened with setns when
        this process can enter the namespace, else by netcut's helper and passed back over a
        unix socket (as verifiers' own helper does), in the mode `prepare_execution` will
        use (netcut.modes)."""
        sandbox = f"{self.engine}:{self._container}"
        how, _ = cut_mode_for(self.egress.cut_mode, parse_target(sandbox))
        if how == "helper":
            spec = ListenSpec("tcp", "127.0.0.1", 0)
            (sock,) = await listen_in_sandbox(sandbox, [spec], self.egress.helper_image)
            return sock
        path = namespace_path(sandbox)
        return listen_in_netns(path, "127.0.0.1", 0)

    def _served_inside(self, url: str) -> bool:
        """A host callback: verifiers' own listener on the container's loopback serves it."""
        proxy = self._proxy
        parts = urlsplit(url)
        return (
            proxy is not None
            and parts.port == proxy.port
            and (parts.hostname in ("127.0.0.1", "localhost"))
        )

    async def prepare_execution(self, routes: list[str] | None) -> None:
        if self._host is not None:
            await self._host.prepare_execution(routes)
            return
        if not self.network_restricted:
            return
        if routes is None:
            await self.egress.release()
            self._set_own_policy(NetworkPolicyConfig(), [], allow_non_global=True)
            return
        # verifiers' listener keeps serving host callbacks, and nothing else
        framework = [
            urlsplit(url)._replace(path="", query="", fragment="").geturl() for url in routes
        ]
        self._set_own_policy(NetworkPolicyConfig(allow=[]), framework)
        await self.egress.prepare(routes)

    def _set_own_policy(self, config: Any, routes: list[str], **kw: Any) -> None:
        if self._proxy is not None:
            self._proxy.policy = NetworkPolicy(config, routes, **kw)

    def _exec(self, env: dict[str, str], *, stdin: bool = False) -> list[str]:
        if self.egress.execution is not None:
            env = {**env, **self.egress.env()}
        command: list[str] = super()._exec(env, stdin=stdin)
        return command

    def _proxy_env(self) -> dict[str, str]:
        """What verifiers gives a background server started during setup: our proxy, as
        planned (it answers once the box is prepared)."""
        return dict(self.egress.plan.env)

    async def teardown(self) -> None:
        with contextlib.suppress(Exception):
            await self.egress.release()
        await super().teardown()


class EgressPodmanRuntime(EgressDockerRuntime):
    """The same for podman (verifiers' `PodmanRuntime`)."""

    engine = "podman"
    info_cls = _docker_mod.PodmanRuntime.info_cls


@contextlib.asynccontextmanager
async def egress_runtime(config: Any, **kwargs: Any) -> AsyncIterator[EgressDockerRuntime]:
    """A started `EgressDockerRuntime` for `Agent.run(task, runtime=...)`, stopped after."""
    runtime = EgressDockerRuntime(config, **kwargs)
    try:
        await runtime.start()
        yield runtime
    finally:
        await runtime.stop()


# The namespace runtime and the runtime hook live in modules of their own (they import this
# one); they are public here, loaded on first use.
_LAZY = {
    "NamespaceConfig": "vf_runtime",
    "NamespaceRuntime": "vf_runtime",
    "ImageNotSupported": "vf_runtime",
    "install": "vf_hook",
    "uninstall": "vf_hook",
    "UnsupportedVerifiers": "vf_hook",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__package__}.{module}"), name)

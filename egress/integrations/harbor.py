"""Harbor 0.26 environments whose network policy egress-netcut enforces
(docs/integrations.md#harbor). Importing this module imports Harbor (Python >= 3.12).

Harbor switches an environment's `NetworkPolicy` per phase: the trial calls
`set_network_policy(agent phase)` before the agent runs and `set_network_policy(baseline)`
after it, and the environment's `_apply_network_policy` does the work. Here that work is
`HarborEgress.apply`:

- `allowlist` -> `prepare_execution(..., transparent=True)`: the sandbox is cut, every TCP
  connection and DNS query goes to the proxy (tools need no proxy settings, as with Harbor's
  own gost sidecar), and `from_harbor` decides (every port, as Harbor does);
- `no-network` -> the same cut with no allow rules: only the framework routes remain;
- `public` -> `release_execution(restore=True)`: the sandbox is online again (the verifier
  phase, after the agent).

The model host Harbor adds to a restricted policy (its inference endpoint's host) becomes a
framework route when it is one of the environment's `framework_routes`: reachable on that
URL's exact host and port only, instead of every port of the host.

Two environments (pass their import path to `harbor trials start --env`):
`EgressDockerEnvironment` (Harbor's docker environment without its sidecar; works as a
docker-group user: the cut, the transparent redirects and the sandbox's listeners come from
netcut's helper then, docs/user-guide.md#helper-mode) and `NamespaceEnvironment` (a network
namespace and a private root, no container engine; **root only**: it creates namespaces and
enters them).
"""

from __future__ import annotations

import asyncio
import json
import shlex
import tempfile
import uuid
from pathlib import Path
from typing import Any

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities
from harbor.environments.docker.docker import DockerEnvironment
from harbor.models.task.config import NetworkMode, NetworkPolicy

from netcut.helper.session import default_image
from netcut.modes import missing_direct_caps
from netcut.safety import own_effective_caps

from ..boundary.execution import CUT_MODE_CHOICES
from ..boundary.plan import client_id_from
from ..validate import as_choice
from .hb_policy import (
    NETNS_SERVICE,
    HarborEgress,
    ensure_image,
    phase_policy,
    shared_namespace_override,
)
from .nsbox import NamespaceBox
from .shared import load_evaluator

# What egress enforces of Harbor's capability flags. IPv6 entries are refused by Harbor
# before start: a cut sandbox has no IPv6 at all, so an IPv6 allowlist entry could not be
# honoured (docs/integrations.md#harbor).
NETWORK_CAPABILITIES = {
    "disable_internet": True,
    "network_allowlist": True,
    "network_allowlist_hostnames": True,
    "network_allowlist_wildcard_hostnames": True,
    "network_allowlist_ipv4_addresses": True,
    "network_allowlist_ipv4_cidrs": True,
    "network_allowlist_ipv6_addresses": False,
    "network_allowlist_ipv6_cidrs": False,
    "dynamic_network_policy": True,
}


def _routes(value: object) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return list(value)
    raise ValueError(f"framework_routes must be URLs (a list or comma-separated), not {value!r}")


class EgressNetworkPolicy:
    """What a Harbor environment class gains by naming this class before its Harbor base:
    the network capabilities egress enforces, and `_apply_network_policy` handed to its
    `HarborEgress` (`self.egress`, which the environment creates once its sandbox exists).
    Harbor finds both by name on the environment, so they have to be methods of it."""

    egress: HarborEgress | None = None

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        base = super().capabilities  # type: ignore[misc]
        return base.model_copy(update=NETWORK_CAPABILITIES)

    async def _apply_network_policy(self, network_policy: NetworkPolicy) -> None:
        if self.egress is None:
            raise RuntimeError("egress: the environment's sandbox is not started")
        await self.egress.apply(network_policy)

    async def _enforce_startup_policy(self) -> None:
        """Harbor's startup (`[environment]`) policy, once the sandbox exists and its setup
        has run (as an image build runs online before a docker container starts)."""
        policy: NetworkPolicy = self.network_policy  # type: ignore[attr-defined]
        if self.egress is not None and policy.network_mode != NetworkMode.PUBLIC:
            await self.egress.apply(policy)


class EgressDockerEnvironment(EgressNetworkPolicy, DockerEnvironment):
    """Harbor's docker environment with egress in place of its gost sidecar.

    When a policy of the trial is restricted (when Harbor would start its sidecar), every
    service Harbor would put behind its sidecar (`main` and each task service without
    `network_mode` / `networks` of its own: Harbor's own selection) shares one network
    namespace, held by `NETNS_SERVICE`, as they share the sidecar's in Harbor: they reach
    each other on `localhost`. That namespace is cut with `netcut` and served by the proxy
    on this process's event loop, so every one of those services is behind the policy.
    As root, netcut enters it (direct mode); as a docker-group user, one helper container
    per phase change cuts it and opens its listeners, passing them back
    (docs/user-guide.md#helper-mode). Extra kwargs (`--ek`): `egress_policy` (an evaluator
    policy file), `framework_routes` (URLs), `cut_mode` (`auto`, `direct` or `helper`)."""

    def __init__(
        self,
        *args: Any,
        egress_policy: str | None = None,
        framework_routes: object = None,
        cut_mode: str = "auto",
        **kwargs: Any,
    ) -> None:
        self._egress_evaluator = load_evaluator(egress_policy)
        self._egress_routes = _routes(framework_routes)
        self._egress_cut_mode = as_choice(cut_mode, "egress-docker cut_mode", CUT_MODE_CHOICES)
        policies = [kwargs.get("network_policy"), *(kwargs.get("phase_network_policies") or ())]
        # Harbor's own rule for starting its sidecar: some policy of the trial is restricted
        self._egress_shared = any(
            p is not None and NetworkMode(p.network_mode) != NetworkMode.PUBLIC for p in policies
        )
        self._egress_override: Path | None = None
        super().__init__(*args, **kwargs)

    @property
    def _docker_compose_paths(self) -> list[Path]:
        paths: list[Path] = list(super()._docker_compose_paths)
        return [*paths, self._egress_override] if self._egress_override is not None else paths

    def _write_shared_namespace_override(self) -> None:
        services = self._egress_controlled_service_names()
        image = default_image()
        ensure_image(self.runtime().engine[0], image)
        override = shared_namespace_override(services, image)
        directory = Path(tempfile.mkdtemp(prefix="egress-harbor-compose-"))
        path = directory / "docker-compose-egress-netns.json"
        path.write_text(json.dumps(override, indent=2))
        self._egress_override = path

    @staticmethod
    def _requires_egress_control(**_: Any) -> bool:
        return False  # never Harbor's sidecar: egress enforces every policy

    @staticmethod
    def type() -> str:
        return "egress-docker"

    async def start(self, force_build: bool) -> None:
        if self._egress_shared:
            await asyncio.to_thread(self._write_shared_namespace_override)
        await super().start(force_build)
        holder = NETNS_SERVICE if self._egress_shared else "main"
        found = await self._run_docker_compose_command(["ps", "-q", holder])
        container = (found.stdout or "").strip().splitlines()[0]
        self.egress = HarborEgress(
            f"docker:{container}",
            _client_id(self.session_id),
            evaluator=self._egress_evaluator,
            framework_routes=self._egress_routes,
            prepare_args={"cut_mode": self._egress_cut_mode},
            logger=self.logger,
        )
        await self._enforce_startup_policy()

    async def stop(self, delete: bool) -> None:
        try:
            if self.egress is not None:
                await self.egress.close()
            await super().stop(delete)
        finally:
            if self._egress_override is not None:
                self._egress_override.unlink(missing_ok=True)
                self._egress_override.parent.rmdir()
                self._egress_override = None


class NamespaceEnvironment(EgressNetworkPolicy, BaseEnvironment):
    """A Harbor environment that is a network namespace plus a private root directory
    (`egress.integrations.nsbox`): no container engine, so it runs wherever `ip netns` and
    `unshare` do. Root only (it creates and enters namespaces); a docker-group user runs
    `EgressDockerEnvironment` instead. Kwargs (`--ek`): `netns` (an existing namespace,
    wired by the operator; without it a new one with only loopback), `egress_policy`,
    `framework_routes`, `root_dir`. The task's `environment/setup.sh`, if any, runs in it
    at start, online."""

    def __init__(
        self,
        *args: Any,
        netns: str | None = None,
        egress_policy: str | None = None,
        framework_routes: object = None,
        root_dir: str | None = None,
        **kwargs: Any,
    ) -> None:
        self._netns = netns
        self._own_netns = netns is None
        self._egress_evaluator = load_evaluator(egress_policy)
        self._egress_routes = _routes(framework_routes)
        self._root_dir = root_dir
        self._box: NamespaceBox | None = None
        super().__init__(*args, **kwargs)

    @staticmethod
    def type() -> str:
        return "egress-namespace"

    def _validate_definition(self) -> None:
        """Nothing to build: `environment/` holds at most a `setup.sh`."""

    @property
    def box(self) -> NamespaceBox:
        if self._box is None:
            raise RuntimeError("egress: the namespace environment is not started")
        return self._box

    async def start(self, force_build: bool) -> None:
        if missing_direct_caps(own_effective_caps()):
            raise PermissionError(
                "egress-namespace needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN: it creates and "
                "enters network namespaces); as a docker-group user use egress-docker "
                "(docs/integrations.md#harbor)"
            )
        if self._netns is None:
            self._netns = f"egh-{uuid.uuid4().hex[:10]}"
            await _run("ip", "netns", "add", self._netns)
            await _run("ip", "-n", self._netns, "link", "set", "lo", "up")
        root = Path(self._root_dir or tempfile.mkdtemp(prefix="egress-harbor-"))
        self._box = NamespaceBox(root, self._netns)
        await self._box.start()
        self.egress = HarborEgress(
            self._netns,
            _client_id(self.session_id),
            evaluator=self._egress_evaluator,
            framework_routes=self._egress_routes,
            logger=self.logger,
        )
        setup = self.environment_dir / "setup.sh"
        if setup.is_file():
            self.box.upload(setup, "/tmp/egress-setup.sh")
            done = await self.exec("sh /tmp/egress-setup.sh", cwd="/")
            if done.return_code != 0:
                raise RuntimeError(
                    f"environment/setup.sh failed ({done.return_code}): {done.stderr}"
                )
        await self._enforce_startup_policy()
        await self._upload_environment_dir_after_start()

    async def stop(self, delete: bool) -> None:
        try:
            if self.egress is not None:
                await self.egress.close()
        finally:
            if self._box is not None:
                await self._box.stop(delete=delete)
                self._box = None
            if self._own_netns and self._netns is not None:
                await _run("ip", "netns", "del", self._netns)
                self._netns = None

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        done = await self.box.exec(
            command,
            cwd=cwd or self.task_env_config.workdir or "/app",
            env=self._merge_env(env),
            user=self._resolve_user(user),
            timeout_sec=timeout_sec,
        )
        return ExecResult(stdout=done.stdout, stderr=done.stderr, return_code=done.return_code)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        self.box.upload(Path(source_path), target_path)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        self.box.upload(Path(source_dir), target_dir)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        self.box.download(source_path, Path(target_path))

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        self.box.download(source_dir, Path(target_dir))


def _client_id(session_id: str) -> str:
    return client_id_from(session_id)


async def _run(*argv: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)}: {err.decode(errors='replace').strip()}")


__all__ = [
    "NETNS_SERVICE",
    "NETWORK_CAPABILITIES",
    "EgressDockerEnvironment",
    "EgressNetworkPolicy",
    "HarborEgress",
    "NamespaceEnvironment",
    "phase_policy",
    "shared_namespace_override",
]

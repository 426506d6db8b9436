"""verifiers 0.4: a runtime that is a network namespace on this host, behind egress
(docs/integrations.md#the-namespace-runtime).

No container engine and no image: every program of the rollout runs in the namespace
(`ip netns exec`), as an unprivileged user (`nobody` by default) with no capabilities at all
(bounding set empty, so nothing in the box can undo the cut and netcut's safety scan finds
nothing), with an environment of its own (not the host's: `PATH`, `HOME`, the runtime's and
the caller's values, and once prepared our proxy environment). Files live in a working
directory of the runtime's own on the host, owned by that user. `prepare_execution(routes)`
is `VerifiersBoundary`'s, exactly as in `EgressDockerRuntime`.

The namespace is `netns` (one the operator wired: veth, address, route, so that setup is
online), else a new one with loopback only, deleted when the runtime stops. Root in the host
filesystem view is not a filesystem boundary: this isolates the network, for running and
testing on one machine, not a jail for hostile code.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import subprocess
import uuid
from typing import Any, Literal

from verifiers.v1.configs.runtime import NetworkPolicyConfig
from verifiers.v1.runtimes.subprocess import SubprocessConfig, SubprocessRuntime

from ..boundary.plan import client_id_from
from ..errors import EgressError
from ..policy.rules import Policy
from .verifiers import VerifiersBoundary, runtime_policy

PATH = "/usr/local/bin:/usr/bin:/bin"


class NamespaceConfig(NetworkPolicyConfig):  # type: ignore[misc]
    """The namespace runtime's config: verifiers' own `allow` / `block` (so
    `with_task_network_policy` and `network_restricted` are verifiers'), plus where and as
    whom programs run. `image` exists only so that a task naming an image is refused
    instead of silently run without it."""

    type: Literal["egress-namespace"] = "egress-namespace"
    netns: str | None = None
    """An existing namespace (wired by the operator), or None for a new one, loopback only."""
    user: str = "nobody"
    """The user every program runs as (a name or a numeric uid), without capabilities."""
    image: str | None = None
    any_connect_port: bool | None = None
    """`from_verifiers`'s widening opt-in (CONNECT to every port of a rule without one);
    None: `$EGRESS_VERIFIERS_ANY_CONNECT_PORT` (docs/integrations.md#connect-ports)."""


class ImageNotSupported(EgressError):
    """A namespace runtime was asked for an image: it has none (use `EgressDockerRuntime`)."""


def _identity(user: str) -> tuple[int, int]:
    """`user` as (uid, gid): a name from the passwd database, or a number (gid = uid)."""
    if user.isdigit():
        return int(user), int(user)
    entry = pwd.getpwnam(user)
    return entry.pw_uid, entry.pw_gid


class NamespaceRuntime(SubprocessRuntime):  # type: ignore[misc]
    """verifiers' subprocess runtime with every program in a network namespace as an
    unprivileged user, and egress's execution boundary (module docstring).

    `config` is a `NamespaceConfig` (or any verifiers `NetworkPolicyConfig`: a `DockerConfig`
    under `install(runtime="namespace")`, whose image must then be its default);
    `policy` overrides `from_verifiers(config)`; `any_connect_port` (else the config's, else
    `$EGRESS_VERIFIERS_ANY_CONNECT_PORT`) is its widening opt-in. The audit's client id is
    the runtime's name."""

    def __init__(
        self,
        config: Any,
        name: str | None = None,
        *,
        policy: Policy | None = None,
        transparent: bool = False,
        any_connect_port: bool | None = None,
    ) -> None:
        super().__init__(SubprocessConfig(), name)
        self.config = config  # verifiers reads `network_restricted` and `type` off it
        self.netns: str | None = getattr(config, "netns", None)
        self._own_netns = self.netns is None
        self.uid, self.gid = _identity(str(getattr(config, "user", "nobody")))
        if any_connect_port is None:
            any_connect_port = getattr(config, "any_connect_port", None)
        chosen = policy if policy is not None else runtime_policy(config, any_connect_port)
        self.egress = VerifiersBoundary(
            lambda: self._namespace(),
            chosen,
            client_id=client_id_from(self.name),
            transparent=transparent,
        )

    def _namespace(self) -> str:
        if self.netns is None:
            raise RuntimeError("egress: the namespace runtime is not started")
        return self.netns

    async def start(self) -> None:
        image = getattr(self.config, "image", None)
        field = type(self.config).model_fields.get("image")
        if image is not None and (field is None or image != field.default):
            raise ImageNotSupported(
                f"the namespace runtime runs no image ({image!r} was asked for): use "
                "EgressDockerRuntime, or a task without an image "
                "(docs/integrations.md#the-namespace-runtime)"
            )
        if self.netns is None:
            name = f"vfns-{uuid.uuid4().hex[:10]}"
            await _run("ip", "netns", "add", name)
            self.netns = name
            await _run("ip", "-n", name, "link", "set", "lo", "up")
        await super().start()
        os.chown(self.workdir, self.uid, self.gid)  # relative paths work from it as the user

    def _argv(self, argv: list[str], env: dict[str, str]) -> list[str]:
        """`argv` in the namespace as the user, capability-free, with only this environment."""
        merged = {"PATH": PATH, "HOME": "/tmp", **self.process_env(env), **self.egress.env()}
        enter = ["ip", "netns", "exec", self._namespace(), "/usr/bin/env", "-i"]
        env_args = [f"{k}={v}" for k, v in merged.items()]
        ids = [f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups"]
        caps = ["--inh-caps=-all", "--bounding-set=-all"]
        return [*enter, *env_args, "setpriv", *ids, *caps, "--", *argv]

    async def run(self, argv: list[str], env: dict[str, str]) -> Any:
        return await super().run(self._argv(argv, env), {})

    async def open_process(self, argv: list[str], env: dict[str, str]) -> Any:
        return await super().open_process(self._argv(argv, env), {})

    async def run_background(self, argv: list[str], env: dict[str, str], log: str) -> None:
        # a server started during setup gets the planned proxy environment (it answers once
        # the box is prepared), as EgressDockerRuntime's
        planned = {**env, **self.egress.plan.env}
        await super().run_background(self._argv(argv, planned), {}, log)

    async def prepare_execution(self, routes: list[str] | None) -> None:
        """Cut for the agent (verifiers' rollout calls it after setup); None releases."""
        if self.network_restricted:
            await self.egress.prepare(routes)

    async def teardown(self) -> None:
        with contextlib.suppress(Exception):
            await self.egress.release()
        try:
            await super().teardown()
        finally:  # verifiers may never call cleanup(): the namespace goes with the runtime
            self._drop_netns()

    def cleanup(self) -> None:
        super().cleanup()
        self._drop_netns()

    def _drop_netns(self) -> None:
        """Delete the namespace this runtime made (once; one it was given stays)."""
        if self._own_netns and self.netns is not None:
            subprocess.run(["ip", "netns", "delete", self.netns], check=False, timeout=30)
            self.netns = None


async def _run(*argv: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {err.decode(errors='replace').strip()}")

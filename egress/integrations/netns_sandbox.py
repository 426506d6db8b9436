"""inspect-ai: `egress-netns`, a sandbox that is a network namespace plus a private root on
this host, for the `egress` sandbox to wrap where no container engine runs
(docs/integrations.md#the-namespace-sandbox).

Each sample gets a `NamespaceBox` (egress.integrations.nsbox): a namespace (the config's
`netns`, wired by the operator so that setup is online, else a new one with loopback only,
deleted after the sample) and a root directory of its own, the host's `/usr` and `/etc`
read-only. The safe defaults a user would otherwise write by hand:

- **uid**: every command runs as `user` (default `nobody`) unless the caller names another;
- **capabilities**: `CAP_NET_ADMIN`, `CAP_NET_RAW`, `CAP_SYS_ADMIN` are out of every
  process's bounding set (nothing in the box can undo the cut);
- **environment**: `PATH` and `HOME` and what the caller passes, never the host's;
- **files** written by inspect (the sample's `files`, its `setup` script in `/tmp`) and the
  directories a write creates belong to `user`, so the setup script inspect writes and marks
  executable runs as that user and can write beside itself (root's files, or a 0700 host
  temporary directory, made it fail as `nobody`); a path that leaves the root (`..`, a link)
  is refused.

Root in a chroot is no filesystem security boundary: this isolates the network, for running
and testing on one machine, not a jail for hostile code.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shlex
import tempfile
import uuid
from pathlib import Path
from typing import Any

from inspect_ai.util import (
    ExecResult,
    SandboxConnection,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    sandboxenv,
)
from pydantic import BaseModel, ConfigDict

from .nsbox import BoxError, NamespaceBox

WORKDIR = "/app"


class NamespaceSandboxConfig(BaseModel):  # type: ignore[misc]
    """The `egress-netns` sandbox's configuration (frozen: inspect hashes it)."""

    model_config = ConfigDict(frozen=True)

    netns: str | None = None
    """An existing namespace (veth, address and route wired, so setup is online), or None
    for a new one per sample with loopback only."""
    user: str = "nobody"
    """Who commands run as when the caller names nobody (a name or a numeric uid)."""


def _ids(user: str) -> tuple[int, int]:
    if user.isdigit():
        return int(user), int(user)
    entry = pwd.getpwnam(user)
    return entry.pw_uid, entry.pw_gid


@sandboxenv(name="egress-netns")
class NamespaceSandboxEnvironment(SandboxEnvironment):  # type: ignore[misc]
    """One sample's namespace box (module docstring); `egress_target` is its namespace."""

    def __init__(self, box: NamespaceBox, config: NamespaceSandboxConfig, own_netns: bool):
        super().__init__()
        self.box = box
        self.config = config
        self.own_netns = own_netns
        self.egress_target = box.netns
        self.uid, self.gid = _ids(config.user)

    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        return NamespaceSandboxConfig(**config)

    @classmethod
    async def sample_init(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, metadata: dict[str, str]
    ) -> dict[str, SandboxEnvironment]:
        cfg = _config(config)
        netns, own = cfg.netns, cfg.netns is None
        if netns is None:
            netns = f"insp-{uuid.uuid4().hex[:10]}"
            await _run("ip", "netns", "add", netns)
            await _run("ip", "-n", netns, "link", "set", "lo", "up")
        root = Path(tempfile.mkdtemp(prefix="egress-inspect-"))
        os.chmod(root, 0o755)
        box = NamespaceBox(root, netns)
        try:
            await box.start()
        except BaseException:
            await box.stop(delete=True)
            if own:
                await _run("ip", "netns", "delete", netns)
            raise
        env = cls(box, cfg, own)
        os.chown(root / WORKDIR.lstrip("/"), env.uid, env.gid)
        return {"default": env}

    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        for env in environments.values():
            if isinstance(env, NamespaceSandboxEnvironment):
                await env.box.stop(delete=True)
                if env.own_netns:
                    await _run("ip", "netns", "delete", env.box.netns)

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
        data = input.encode() if isinstance(input, str) else input
        where = self._path(cwd or WORKDIR)
        done = await self.box.exec(
            shlex.join(cmd),
            cwd=where,
            env={
                "HOME": "/tmp" if (user or self.config.user) != "root" else "/root",
                **(env or {}),
            },
            user=user or self.config.user,
            timeout_sec=timeout,
            input=data,
        )
        if done.return_code == 124 and timeout is not None:
            raise TimeoutError(f"command timed out after {timeout} s: {shlex.join(cmd)}")
        return ExecResult(done.return_code == 0, done.return_code, done.stdout, done.stderr)

    def _path(self, file: str) -> str:
        return file if file.startswith("/") else f"{WORKDIR}/{file}"

    async def write_file(self, file: str, contents: str | bytes) -> None:
        """Written below the root and owned by the sandbox's user (created parents too)."""
        data = contents.encode() if isinstance(contents, str) else contents
        host = self.box.host_path(self._path(file))
        await asyncio.to_thread(self._write, host, data)

    def _write(self, host: Path, data: bytes) -> None:
        missing = [p for p in (host.parent, *host.parent.parents) if not p.exists()]
        host.parent.mkdir(parents=True, exist_ok=True)
        for made in missing:
            os.chown(made, self.uid, self.gid)
        if host.is_symlink():
            raise BoxError(f"{host} is a link: not written through")
        host.write_bytes(data)
        os.chown(host, self.uid, self.gid)

    async def read_file(self, file: str, text: bool = True) -> Any:
        host = self.box.host_path(self._path(file))
        if host.is_dir():
            raise IsADirectoryError(file)
        data = await asyncio.to_thread(host.read_bytes)
        return data.decode() if text else data

    async def connection(self, *, user: str | None = None) -> SandboxConnection:
        pid, root = self.box.holder_pid, shlex.quote(str(self.box.root))
        command = f"nsenter --target={pid} --mount --net -- chroot {root} /bin/bash"
        return SandboxConnection(type="egress-netns", command=command)


def _config(config: SandboxEnvironmentConfigType | None) -> NamespaceSandboxConfig:
    if isinstance(config, NamespaceSandboxConfig):
        return config
    if config is None:
        return NamespaceSandboxConfig()
    if isinstance(config, dict):
        return NamespaceSandboxConfig(**config)
    if isinstance(config, str):
        return NamespaceSandboxConfig(netns=config)
    raise TypeError(
        f"the egress-netns sandbox takes a NamespaceSandboxConfig (or a namespace name), not "
        f"{type(config).__name__} (docs/integrations.md#the-namespace-sandbox)"
    )


async def _run(*argv: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {err.decode(errors='replace').strip()}")


__all__ = ["NamespaceSandboxConfig", "NamespaceSandboxEnvironment"]

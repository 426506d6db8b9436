"""The target of helper mode: a container, as its runtime reports it (docs/netcut.md#helper-mode).

Shell. `TargetContainer` is one container target: its runtime, full id, PID and `inspect` data
(through the engine's CLI, the Docker Engine API, or containerd's `ctr`), the namespace
identity its record is keyed by, and the record itself. `container_findings` judges from
`inspect` the capabilities that could undo a cut (the host cannot read the container's /proc
in this mode); `container_network` reads the addresses `egress` needs.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import subprocess
from dataclasses import dataclass
from typing import Any

from netcut.errors import ApplyFailed, InvalidInput, PrivilegeError, TargetNotFound
from netcut.helper import engineapi
from netcut.helper.container import RUN_TIMEOUT_S, is_ctr, why_failed
from netcut.records import Store
from netcut.resolve import (
    TargetRef,
    containerd_namespace,
    containerd_task,
    find_runtime,
    parse_nameservers,
    socket_hint,
)

_DANGEROUS = {"NET_ADMIN", "NET_RAW", "SYS_ADMIN"}


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise ApplyFailed(f"{argv[0]} {argv[1]}: no answer within {timeout:g}s") from None
    except FileNotFoundError:
        raise TargetNotFound(f"container runtime {argv[0]} not found") from None


def container_findings(info: dict[str, Any]) -> tuple[str, ...]:
    """Capabilities the container's processes may hold that could undo a cut, judged from
    `inspect` (the host cannot read the container's /proc in this mode). podman reports the
    container's bounding set (`BoundingCaps`), which is judged as it is; docker reports only
    what was added and dropped relative to its default set, which includes NET_RAW, so a
    docker container that does not drop it is reported."""
    host = info.get("HostConfig") or {}
    if host.get("Privileged"):
        return ("container is privileged (all capabilities)",)
    bounding = info.get("BoundingCaps")
    if isinstance(bounding, list):
        held = {str(c).upper().removeprefix("CAP_") for c in bounding} & _DANGEROUS
        return tuple(f"container may hold CAP_{name} (bounding set)" for name in sorted(held))
    added = {str(c).upper().removeprefix("CAP_") for c in host.get("CapAdd") or ()}
    dropped = {str(c).upper().removeprefix("CAP_") for c in host.get("CapDrop") or ()}
    held = set(_DANGEROUS & added) if "ALL" not in added else set(_DANGEROUS)
    if "NET_RAW" not in dropped and "ALL" not in dropped:
        held.add("NET_RAW")
    return tuple(f"container may hold CAP_{name}" for name in sorted(held))


@dataclass(frozen=True)
class ContainerNetwork:
    """A container's addresses and the host's addresses on its bridges, as its runtime's
    `inspect` reports them: what egress's gateway mode needs without entering the namespace
    (docs/user-guide.md#helper-mode)."""

    gateways: tuple[str, ...]  # IPv4, in the runtime's network order
    addresses: tuple[str, ...]  # the container's own IPv4 and global IPv6 addresses


def container_network(info: object) -> ContainerNetwork:
    """Pure: the gateways and addresses in `inspect` output (docker's and podman's share
    `NetworkSettings` and its `Networks` map). Values that are not addresses are skipped."""
    settings = info.get("NetworkSettings") if isinstance(info, dict) else None
    settings = settings if isinstance(settings, dict) else {}
    nets = settings.get("Networks")
    nets = nets if isinstance(nets, dict) else {}
    blocks = [settings, *(n for n in nets.values() if isinstance(n, dict))]
    gateways: dict[str, None] = {}
    addresses: dict[str, None] = {}
    for block in blocks:
        for key, out in (
            ("Gateway", gateways),
            ("IPAddress", addresses),
            ("GlobalIPv6Address", addresses),
        ):
            value = block.get(key)
            if isinstance(value, str) and _is_address(value, v4=key == "Gateway"):
                out[value] = None
    return ContainerNetwork(tuple(gateways), tuple(addresses))


def _is_address(text: str, *, v4: bool) -> bool:
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        return False
    return addr.version == 4 or not v4


def inspect_network(target: TargetRef) -> ContainerNetwork:
    """`container_network` of a running container, asked of its runtime (one `inspect`).
    Raises InvalidInput (not a container), TargetNotFound."""
    return container_network(TargetContainer(target).info)


class TargetContainer:
    """One container target: its runtime, full id, PID, inspect data."""

    def __init__(self, ref: TargetRef, runtime: str | None = None, api: str | None = None) -> None:
        """`api`: the Docker Engine API's socket to inspect through (helper/engineapi.py),
        else the runtime's CLI."""
        if ref.kind != "container":
            raise InvalidInput(f"{ref}: helper mode needs --container")
        self.ref = ref
        self.runtime = runtime or find_runtime(ref.runtime)
        self.namespace: str | None = None
        self.identity: tuple[int, int] | None = None  # the namespace's (`identify`)
        if is_ctr(self.runtime):
            self._containerd()
            return
        try:
            info = self._inspect(api) if api is not None else self._inspect_cli()
            self.info: dict[str, Any] = info[0] if isinstance(info, list) else info
            self.id = str(self.info["Id"])
            pid = int(self.info.get("State", {}).get("Pid") or 0)
        except (ValueError, KeyError, IndexError, TypeError):
            raise TargetNotFound(f"container {ref.value!r}: unreadable inspect output") from None
        if pid == 0:
            raise TargetNotFound(f"container {ref.value!r} via {self.runtime}: not running")
        self.pid = pid

    def _inspect_cli(self) -> Any:
        done = _run(
            [self.runtime, "inspect", "--format", "{{json .}}", self.ref.value], RUN_TIMEOUT_S
        )
        if done.returncode != 0:
            why = why_failed(done.stderr or done.stdout, done.returncode)
            if socket_hint(why):
                raise PrivilegeError(
                    f"container {self.ref.value!r} via {self.runtime}: {why}{socket_hint(why)}"
                )
            raise TargetNotFound(f"container {self.ref.value!r} via {self.runtime}: {why}")
        return json.loads(done.stdout)

    def _inspect(self, api: str) -> Any:
        try:
            return engineapi.Api(api).inspect(self.ref.value)
        except engineapi.EngineApiStatus as exc:
            if exc.status != 404:
                raise
            raise TargetNotFound(
                f"container {self.ref.value!r} via {self.runtime}: {exc.said}"
            ) from None

    def _containerd(self) -> None:
        """A containerd task: its PID from `ctr task ls`, its capabilities from the OCI
        spec in `ctr containers info` (the bounding set, judged like podman's)."""
        resolved = containerd_task(self.ref, self.runtime)
        assert resolved.pid is not None
        self.namespace = containerd_namespace(self.ref)
        self.pid, self.id = resolved.pid, self.ref.value
        argv = [self.runtime, "-n", self.namespace, "containers", "info", self.id]
        done = _run(argv, RUN_TIMEOUT_S)
        try:
            spec = json.loads(done.stdout)["Spec"]
            process = spec.get("process") or {}
            bounding = (process.get("capabilities") or {}).get("bounding") or []
        except (ValueError, KeyError, TypeError, AttributeError):
            why = why_failed(done.stderr or done.stdout, done.returncode)
            raise TargetNotFound(
                f"container {self.id!r} via ctr: no readable spec: {why}"
            ) from None
        self.info = {"Id": self.id, "BoundingCaps": list(bounding)}

    def __str__(self) -> str:
        return f"{self.ref} (helper via {os.path.basename(self.runtime)})"

    @property
    def name(self) -> str:
        """The container's name as its runtime reports it (docker: `/NAME`), or its id."""
        name = self.info.get("Name")
        return name.lstrip("/") if isinstance(name, str) and name.strip("/") else self.id

    def identify(self, seen: tuple[int | None, int] | None) -> None:
        """The namespace's nsfs identity, by which its record is keyed in both modes: as the
        helper saw it from inside (its /proc/self/ns/net; a host process that is not root
        cannot stat the container's), else as this host sees /proc/PID/ns/net."""
        self.identity = None
        if seen is not None:
            dev, ino = seen
            if dev is None:  # only the inode was read: nsfs has one device, ours says it
                dev = os.stat("/proc/self/ns/net").st_dev
            self.identity = (dev, ino)
            return
        try:
            st = os.stat(f"/proc/{self.pid}/ns/net")
        except OSError:
            return
        self.identity = (st.st_dev, st.st_ino)

    def store(self) -> Store:
        """The namespace's record, the same one direct mode uses (keyed by the netns
        identity); only when neither the helper nor the host could tell it, the container
        id. A record an older netcut kept by container id moves to the identity's name."""
        legacy = Store.for_container(self.id)
        if self.identity is None:
            return legacy
        store = Store.for_namespace(self.identity)
        if os.path.exists(legacy.path) and not os.path.exists(store.path):
            with contextlib.suppress(OSError):
                os.replace(legacy.path, store.path)
        return store

    def meta(self) -> dict[str, str]:
        """What a record says about its container: `netcut gc` asks the runtime about it
        when this host cannot see the namespace's holders (docs/netcut.md#collecting-records)."""
        meta = {"target": str(self), "container": self.id, "runtime": self.runtime}
        if self.namespace is not None:
            meta["namespace"] = self.namespace
        return meta

    def nameservers(self) -> tuple[str, ...]:
        try:
            with open(f"/proc/{self.pid}/root/etc/resolv.conf") as f:
                return parse_nameservers(f.read())
        except OSError:
            return ()


__all__ = [
    "ContainerNetwork",
    "TargetContainer",
    "container_findings",
    "container_network",
    "inspect_network",
]

"""Helper-container mode: for hosts whose process cannot enter the container's namespace.

ONE container run per operation (docs/netcut.md#helper-mode). A `--rm -i` container joins the
target's network namespace (`--network container:ID`; containerd's `ctr run`, which has no such
option, joins it by the task's `/proc/PID/ns/net`) and runs /bin/sh reading commands from
its stdin; netcut talks to that shell: it sends the state dump, plans on the host from the
answer (flow.py, the same algorithm as direct mode), sends the cut, then the probe, and closes
stdin. Each request ends with a marker carrying a random token and the exit status, so the
host knows where an answer ends and whether it failed.

Capabilities: `--cap-drop ALL --cap-add NET_ADMIN --cap-add NET_RAW`. NET_ADMIN changes routes,
addresses and netfilter rules and destroys sockets (`ss -K`); NET_RAW is needed because
legacy iptables (libiptc) reads and writes its tables through a raw IP socket
(`socket(AF_INET, SOCK_RAW, IPPROTO_RAW)`), which the kernel refuses without it ("Permission
denied (you must be root)"). `/proc/sys` is read-only in containers by default, so the helper
also gets `--security-opt systempaths=unconfined` (docker) or `unmask=/proc/sys` (podman) to
write the IPv6 sysctls; that adds no capability. `--pull never`: a helper never reaches a
registry.

The image is `--helper-image`, else $NETCUT_HELPER_IMAGE, else `netcut-helper:<hash>`, which
is assembled from this host's own files and imported the first time it is missing
(helper/image.py; `netcut helper-image build` does it ahead of time). The record of a cut is
kept on the host, keyed by the namespace's inode like direct mode's, so either mode restores
a cut made by the other.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from netcut import flow
from netcut.api import KeepLike, parse_keeps, probe_targets
from netcut.argtypes import check_seconds
from netcut.errors import ApplyFailed, InvalidInput, PrivilegeError, TargetNotFound, UnsafeTarget
from netcut.flow import CutResult, RestoreResult
from netcut.helper import engineapi
from netcut.helper.script import parse_probe, render_script
from netcut.helper.session import (
    CAPABILITIES,
    IMAGE_ENV,
    RUN_TIMEOUT_S,
    HelperExecutor,
    default_image,
    helper_argv,
    is_ctr,
    why_failed,
)
from netcut.plan.model import Keep, ProbeResult
from netcut.plan.status import CutStatus
from netcut.plan.transparent import Redirect
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

__all__ = [
    "CAPABILITIES",
    "IMAGE_ENV",
    "ContainerNetwork",
    "container_findings",
    "container_network",
    "cut",
    "cut_and_status",
    "default_image",
    "helper_argv",
    "inspect_network",
    "parse_probe",
    "probe",
    "restore",
    "status",
]


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
    return container_network(_Container(target).info)


class _Container:
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


def cut(
    target: TargetRef,
    keep: list[KeepLike] | tuple[KeepLike, ...] = (),
    *,
    image: str | None = None,
    probe: bool = True,
    expect_blocked: list[KeepLike] | tuple[KeepLike, ...] = (),
    force: bool = False,
    allow_privileged: bool = False,
    dry_run: bool = False,
    probe_timeout: float = 1.0,
    redirect: Redirect | None = None,
) -> CutResult:
    """The helper-mode twin of api.cut (same algorithm, result and errors). `force` is
    accepted for symmetry: a container's namespace is never the host's. `redirect`:
    transparent mode (docs/netcut.md#transparent-mode), its nat rules written by the helper."""
    del force
    keeps, blocked = parse_keeps(keep), probe_targets(expect_blocked, "expect_blocked")
    if redirect is not None and blocked:
        raise InvalidInput(
            "--expect-blocked cannot be probed in transparent mode: every TCP "
            "connection is redirected to the proxy, which judges it"
        )
    with _session(target, image) as (c, ex):
        return _cut_in(
            c,
            ex,
            keeps,
            blocked,
            probe=probe,
            allow_privileged=allow_privileged,
            dry_run=dry_run,
            probe_timeout=probe_timeout,
            redirect=redirect,
        )


def cut_and_status(
    target: TargetRef,
    keep: list[KeepLike] | tuple[KeepLike, ...] = (),
    *,
    image: str | None = None,
    expect_blocked: list[KeepLike] | tuple[KeepLike, ...] = (),
    allow_privileged: bool = False,
    probe_timeout: float = 1.0,
) -> tuple[CutResult, CutStatus]:
    """`cut` (with its probe), then `status`, in one helper run: what egress's
    `prepare_execution` proves before it hands out an environment, for one container start
    instead of two (docs/user-guide.md#helper-mode)."""
    keeps, blocked = parse_keeps(keep), probe_targets(expect_blocked, "expect_blocked")
    with _session(target, image) as (c, ex):
        result = _cut_in(
            c,
            ex,
            keeps,
            blocked,
            probe=True,
            allow_privileged=allow_privileged,
            dry_run=False,
            probe_timeout=probe_timeout,
        )
        return result, flow.status(ex, c.store())


def _cut_in(
    c: _Container,
    ex: HelperExecutor,
    keeps: tuple[Keep, ...],
    blocked: tuple[Keep, ...],
    *,
    probe: bool,
    allow_privileged: bool,
    dry_run: bool,
    probe_timeout: float,
    redirect: Redirect | None = None,
    expect_reachable: tuple[Keep, ...] = (),
) -> CutResult:
    """The cut on an open session: the privilege rail from `inspect`, then flow.cut.
    `redirect` and `expect_reachable`: transparent mode and the listeners the helper opened
    in the namespace (helper/listeners.py)."""
    findings = container_findings(c.info)
    if findings and not allow_privileged:  # a dry run too: it shows what the cut would do
        raise UnsafeTarget(
            f"refusing to cut {c}: {'; '.join(findings)}; pass --allow-privileged to cut anyway",
            findings,
        )
    request = flow.CutRequest(
        keeps,
        ex.nameservers,
        dry_run,
        c.meta(),
        probe,
        blocked,
        probe_timeout,
        redirect,
        expect_reachable,
        resolvers=_probed_resolvers(ex.nameservers),
        query_name=c.name,
    )
    result = flow.cut(ex, c.store(), str(c), request, render=render_script)
    return replace(result, identity=c.identity, mode="helper")


@contextlib.contextmanager
def _session(
    target: TargetRef, image: str | None, binds: tuple[str, ...] = (), *, resolvers: bool = True
) -> Iterator[tuple[_Container, HelperExecutor]]:
    """The helper started first, the target inspected while it starts (one container run and
    one inspect per operation, overlapped: docs/netcut.md#helper-mode); with the Docker
    Engine API the inspect is one request, then the helper starts (helper/engineapi.py).
    `binds`: `HOST:CONTAINER` mounts (helper/listeners.py's directory). Without
    `resolvers` the helper reports only the namespace's identity (a restore's facts)."""
    if target.kind != "container":
        raise InvalidInput(f"{target}: helper mode needs --container")
    runtime = find_runtime(target.runtime)
    with HelperExecutor(runtime, target.value, image) as ex:
        ex.binds = binds
        if is_ctr(runtime):  # its helper joins the task's namespace by PID: resolve first
            c = _Container(target, runtime)
            ex.netns, ex.namespace = f"/proc/{c.pid}/ns/net", c.namespace
            ex.start()
        else:
            ex.start()
            c = _Container(target, runtime, api=ex.api)
            ex.target = c.id  # the container inspected is the one the helper joins
        facts = ex.read_facts() if resolvers else ex.read_identity()
        c.identify(facts.identity)
        if resolvers:
            # the container's own resolvers as the helper reads them, and where the engine's
            # nat rules send DNS; the host adds what it can read itself (containerd's helper
            # image has no resolv.conf of the task's)
            ex.nameservers = tuple(dict.fromkeys((*facts.resolvers, *c.nameservers())))
            ex.dns_unverified = facts.unverified
        yield c, ex


def _probed_resolvers(nameservers: tuple[str, ...]) -> tuple[str, ...]:
    """The resolvers the probe asks: every one but the helper's loopback itself (127.0.0.1,
    ::1: a resolver there is inside the namespace, and port 53 is refused anyway)."""
    return tuple(ns for ns in nameservers if ns not in ("127.0.0.1", "::1"))


def probe(
    target: TargetRef,
    expect_reachable: list[KeepLike] | tuple[KeepLike, ...] = (),
    expect_blocked: list[KeepLike] | tuple[KeepLike, ...] = (),
    *,
    timeout: float = 1.0,
    image: str | None = None,
) -> ProbeResult:
    """Helper-mode twin of api.probe: the same connections, made from a helper container
    in the target's namespace (`netcut probe --mode helper`)."""
    check_seconds(timeout, "timeout")
    reachable = probe_targets(expect_reachable, "expect_reachable")
    blocked = probe_targets(expect_blocked, "expect_blocked")
    with _session(target, image) as (_, ex):
        return ex.probe(reachable, blocked, timeout)


def restore(target: TargetRef, *, image: str | None = None) -> RestoreResult:
    """Helper-mode twin of api.restore."""
    with _session(target, image, resolvers=False) as (c, ex):
        return flow.restore(ex, c.store(), str(c))


def status(target: TargetRef, *, image: str | None = None) -> CutStatus:
    """Helper-mode twin of api.status."""
    with _session(target, image) as (c, ex):
        return flow.status(ex, c.store())


# helper/run.py holds one session across the listeners it opens and the cut that follows
open_session = _session
cut_in_session = _cut_in

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
a cut made by the other. The target container, its `inspect` and the checks on it are
helper/target.py's; the container run and the session with its shell, helper/container.py's
and helper/session.py's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace

from netcut import flow
from netcut.api import KeepLike, parse_keeps, probe_targets
from netcut.argtypes import check_seconds
from netcut.errors import InvalidInput, UnsafeTarget
from netcut.flow import CutResult, RestoreResult
from netcut.helper.script import parse_probe, render_script
from netcut.helper.session import (
    CAPABILITIES,
    IMAGE_ENV,
    HelperExecutor,
    default_image,
    helper_argv,
    is_ctr,
)
from netcut.helper.target import (
    ContainerNetwork,
    TargetContainer,
    container_findings,
    container_network,
    inspect_network,
)
from netcut.plan.model import Keep, ProbeResult
from netcut.plan.status import CutStatus
from netcut.plan.transparent import Redirect
from netcut.resolve import (
    TargetRef,
    find_runtime,
)

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
    c: TargetContainer,
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
) -> Iterator[tuple[TargetContainer, HelperExecutor]]:
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
            c = TargetContainer(target, runtime)
            ex.netns, ex.namespace = f"/proc/{c.pid}/ns/net", c.namespace
            ex.start()
        else:
            ex.start()
            c = TargetContainer(target, runtime, api=ex.api)
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

"""`prepare_execution`'s argument checks (docs/policy.md#types): a wrong argument is a
TypeError/ValueError naming it, raised before anything is opened or cut."""

from __future__ import annotations

from netcut.errors import InvalidInput
from netcut.targetref import TargetRef, canonical, parse_target

from ..policy.rules import Policy
from ..proxy.server import EgressProxy
from ..validate import as_bool, as_choice, as_count, as_instance, as_port, as_str
from .execution import (
    CUT_MODES,
)


def _check_args(
    sandbox: object,
    policy: object,
    proxy: object,
    mode: object,
    proxy_port: object,
    client_id: object,
    token: object,
    gateway: object,
    force: object,
    allow_privileged: object,
    cut_mode: object,
    helper_image: object,
) -> str:
    """Typed arguments (docs/policy.md#types): a wrong one is a TypeError/ValueError naming
    it, raised before anything is opened or cut. Returns the sandbox in its one spelling
    (netcut.targetref.canonical: `1234`, "1234" and "pid:1234" are one sandbox), which egress
    and netcut both read the same way (docs/netcut.md#targets)."""
    what = "prepare_execution sandbox (a namespace name, path, PID or container)"
    if not isinstance(sandbox, TargetRef | int) or isinstance(sandbox, bool):
        sandbox = as_str(sandbox, what)
    try:
        ref = parse_target(sandbox)
    except InvalidInput as exc:
        raise ValueError(f"{what}: {exc}") from None
    as_instance(policy, "prepare_execution policy", Policy, "a Policy")
    as_instance(proxy, "prepare_execution proxy", EgressProxy, "an EgressProxy")
    as_choice(mode, "prepare_execution mode", ("loopback", "gateway"))
    if as_choice(cut_mode, "prepare_execution cut_mode", CUT_MODES) == "helper":
        _check_helper(ref, mode)
    if helper_image is not None:
        as_str(helper_image, "prepare_execution helper_image")
    if as_count(proxy_port, "prepare_execution proxy_port", minimum=0) > 65535:
        raise ValueError(f"prepare_execution proxy_port must be at most 65535, not {proxy_port}")
    for label, value in (("client_id", client_id), ("token", token), ("gateway", gateway)):
        if value is not None:
            as_str(value, f"prepare_execution {label}")
    as_bool(force, "prepare_execution force")
    as_bool(allow_privileged, "prepare_execution allow_privileged")
    return canonical(ref)


def _check_helper(ref: TargetRef, mode: object) -> None:
    """Helper mode is for a host process that cannot enter the sandbox's namespace, so
    everything the boundary does must need no setns (docs/user-guide.md#helper-mode)."""
    if mode != "gateway":
        raise ValueError(
            "prepare_execution cut_mode='helper' needs mode='gateway': a loopback listener is "
            "a socket opened inside the sandbox's namespace (setns), which is what a host that "
            "needs helper mode cannot do; in gateway mode the proxy listens on the host side "
            "of the container's bridge instead"
        )
    if ref.kind != "container":
        raise ValueError(
            f"prepare_execution cut_mode='helper' needs a container sandbox (docker:ID, "
            f"podman:ID or container:ID), not {canonical(ref)!r}: the helper joins the "
            "namespace through its container; use cut_mode='direct' for a namespace"
        )
    if ref.runtime == "containerd":
        raise ValueError(
            "prepare_execution cut_mode='helper' does not apply to containerd (it has no "
            "`run --network container:ID` to start a helper with); use cut_mode='direct'"
        )


def _check_extra_args(
    mode: str,
    transparent: object,
    transparent_port: object,
    dns_port: object,
    socks_port: object,
) -> None:
    as_bool(transparent, "prepare_execution transparent")
    for label, value in (
        ("transparent_port", transparent_port),
        ("dns_port", dns_port),
        ("socks_port", socks_port),
    ):
        if value is not None or label != "socks_port":
            as_port(value, f"prepare_execution {label}")
    if transparent and mode != "loopback":
        raise ValueError(
            "prepare_execution transparent needs mode='loopback' (its listeners "
            "live on the sandbox's own loopback)"
        )

"""`prepare_execution`'s argument checks (docs/policy.md#types): a wrong argument is a
TypeError/ValueError naming it, raised before anything is opened or cut."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from netcut.errors import InvalidInput
from netcut.modes import decide
from netcut.safety import own_effective_caps
from netcut.targetref import TargetRef, canonical, parse_target

from ..policy.rules import FrameworkRoute, Policy, parse_framework_route
from ..proxy.server import EgressProxy
from ..validate import as_bool, as_choice, as_count, as_instance, as_port, as_str, as_str_list
from .execution import CUT_MODE_CHOICES, CutMode, CutModeChoice, Mode

# the engines whose helper opens the listeners a preparation needs (containerd has no
# `run --network container:ID` to start one with)
BOUNDARY_HELPERS = ("docker", "podman")


@dataclass(frozen=True)
class Preparation:
    """`prepare_execution`'s arguments once checked: the sandbox in its one spelling, the
    framework routes parsed. Every later step of the preparation reads them from here."""

    sandbox: str
    policy: Policy
    proxy: EgressProxy
    routes: tuple[FrameworkRoute, ...]
    expect_blocked: tuple[str, ...]
    mode: Mode
    proxy_port: int
    client_id: str | None
    token: str | None
    gateway: str | None
    force: bool
    allow_privileged: bool
    cut_mode: CutMode
    helper_image: str | None
    transparent: bool
    cut_mode_reason: str
    transparent_port: int
    dns_port: int
    socks_port: int | None


def check_preparation(
    sandbox: object,
    policy: Policy,
    proxy: EgressProxy,
    *,
    framework_routes: Iterable[str],
    expect_blocked: Iterable[str],
    mode: Mode,
    proxy_port: int,
    client_id: str | None,
    token: str | None,
    gateway: str | None,
    force: bool,
    allow_privileged: bool,
    cut_mode: CutModeChoice,
    helper_image: str | None,
    transparent: bool,
    transparent_port: int,
    dns_port: int,
    socks_port: int | None,
) -> Preparation:
    """Typed arguments (docs/policy.md#types): a wrong one is a TypeError/ValueError naming
    it, raised before anything is opened or cut. The sandbox gets its one spelling
    (netcut.targetref.canonical: `1234`, "1234" and "pid:1234" are one sandbox), which egress
    and netcut both read the same way (docs/netcut.md#targets)."""
    key = _check_target(sandbox)
    as_instance(policy, "prepare_execution policy", Policy, "a Policy")
    as_instance(proxy, "prepare_execution proxy", EgressProxy, "an EgressProxy")
    as_choice(mode, "prepare_execution mode", ("loopback", "gateway"))
    asked = as_choice(cut_mode, "prepare_execution cut_mode", CUT_MODE_CHOICES)
    how, why = cut_mode_for(asked, parse_target(key))
    if how == "helper":
        _check_helper(parse_target(key))
    if helper_image is not None:
        as_str(helper_image, "prepare_execution helper_image")
    if as_count(proxy_port, "prepare_execution proxy_port", minimum=0) > 65535:
        raise ValueError(f"prepare_execution proxy_port must be at most 65535, not {proxy_port}")
    for label, value in (("client_id", client_id), ("token", token), ("gateway", gateway)):
        if value is not None:
            as_str(value, f"prepare_execution {label}")
    as_bool(force, "prepare_execution force")
    as_bool(allow_privileged, "prepare_execution allow_privileged")
    route_texts = as_str_list(framework_routes, "prepare_execution framework_routes")
    blocked = as_str_list(expect_blocked, "prepare_execution expect_blocked")
    _check_extra_args(mode, transparent, transparent_port, dns_port, socks_port)
    return Preparation(
        sandbox=key,
        policy=policy,
        proxy=proxy,
        routes=tuple(parse_framework_route(r) for r in route_texts),
        expect_blocked=tuple(blocked),
        mode=mode,
        proxy_port=proxy_port,
        client_id=client_id,
        token=token,
        gateway=gateway,
        force=force,
        allow_privileged=allow_privileged,
        cut_mode="helper" if how == "helper" else "direct",
        cut_mode_reason=why,
        helper_image=helper_image,
        transparent=transparent,
        transparent_port=transparent_port,
        dns_port=dns_port,
        socks_port=socks_port,
    )


def cut_mode_for(asked: str, ref: TargetRef, mask: int | None = None) -> tuple[str, str]:
    """The cut mode a preparation uses, and why: netcut's choice (netcut.modes, the one place
    it is made), for the helpers whose listeners the boundary can use (docker and podman). A
    sandbox with no helper gets direct mode even without root, and fails closed naming the
    mode and why (docs/user-guide.md#helper-mode). `mask`: the effective capabilities
    (default: this process's)."""
    caps = own_effective_caps() if mask is None else mask
    choice = decide(
        ref, asked, caps, helper_runtimes=BOUNDARY_HELPERS, asked_as="cut_mode", strict=False
    )
    return choice.mode, choice.reason


def _check_target(sandbox: object) -> str:
    """The sandbox reference in its one spelling, or ValueError/TypeError naming it."""
    what = "prepare_execution sandbox (a namespace name, path, PID or container)"
    if not isinstance(sandbox, TargetRef | int) or isinstance(sandbox, bool):
        sandbox = as_str(sandbox, what)
    try:
        return canonical(parse_target(sandbox))
    except InvalidInput as exc:
        raise ValueError(f"{what}: {exc}") from None


def _check_helper(ref: TargetRef) -> None:
    """Helper mode is for a host process that cannot enter the sandbox's namespace, so
    everything the boundary does must need no setns: the helper opens the loopback listeners
    and passes them back (docs/user-guide.md#helper-mode)."""
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
    mode: str, transparent: object, transparent_port: object, dns_port: object, socks_port: object
) -> None:
    """Transparent mode's and SOCKS5's arguments."""
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

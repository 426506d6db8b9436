"""The boundary's three calls: `prepare_execution`, `update_execution` and
`release_execution` (the package docstring says what they guarantee)."""

from __future__ import annotations

import asyncio
import functools
import os
import secrets
from collections.abc import Iterable
from dataclasses import replace

from netcut.targetref import TargetRef, parse_target

from ..policy.rules import Policy, parse_framework_route
from ..proxy.server import EgressProxy
from ..proxy.telemetry.observe import ExecutionSummary
from ..validate import as_bool, as_choice, as_instance, as_str_list
from .checks import _check_args, _check_extra_args
from .cutting import _cut_and_prove
from .execution import (
    CUT_MODES,
    DNS_PORT,
    TRANSPARENT_PORT,
    CutMode,
    Execution,
    ExecutionNotReady,
    Mode,
    ReleaseFailed,
    _client_id,
    _execution,
    not_ready_kind,
)
from .sandboxes import (
    _audit,
    _bind,
    _extras,
    _refuse_new_keeps,
    _refuse_taken,
    _registry,
    _release_sandbox,
)


async def prepare_execution(
    sandbox: str | int | TargetRef,
    policy: Policy,
    proxy: EgressProxy,
    *,
    framework_routes: Iterable[str] = (),
    mode: Mode = "loopback",
    proxy_port: int = 3128,
    client_id: str | None = None,
    token: str | None = None,
    expect_blocked: Iterable[str] = (),
    gateway: str | None = None,
    force: bool = False,
    allow_privileged: bool = False,
    cut_mode: CutMode = "direct",
    helper_image: str | None = None,
    transparent: bool = False,
    transparent_port: int = TRANSPARENT_PORT,
    dns_port: int = DNS_PORT,
    socks_port: int | None = None,
) -> Execution:
    """Make `sandbox` (a namespace name, path, PID or container: docs/netcut.md#targets)
    reachable only through `proxy`.

    `policy` is the composed policy for this sandbox (see `egress.compose`); the framework
    routes are added to it. `transparent` (loopback mode only) also redirects every TCP
    connection and DNS query of the sandbox to the proxy; `expect_blocked` is not probed
    then (every destination reaches the proxy by design, which judges it). `socks_port`
    opens a SOCKS5 listener beside the proxy listener, bound to this sandbox like it.
    Returns the agent's `Execution`. A second call for a prepared
    sandbox replaces its policy atomically (audited `sandbox_replaced`); the token is kept
    unless a new one is given.

    `cut_mode` is how the namespace is cut, named as netcut's `--mode`: `"direct"` (netcut's
    worker enters it) or `"helper"` (a one-shot helper container shares it; `helper_image`
    as netcut's `--helper-image`). Helper mode takes a docker or podman container and
    `mode="gateway"`: the gateway and the sandbox's addresses come from the runtime's
    `inspect`, and the cut, probe and status run in the helper, so nothing here enters the
    namespace (docs/user-guide.md#helper-mode).

    Raises `TypeError`/`ValueError` for a wrong argument (nothing is touched then), and
    `ExecutionNotReady` if any step fails, with the cause chained: nothing is handed out,
    and everything this sandbox held in the proxy (listeners, forwarders, client) is
    released; the cut, if applied, stays (fail closed).
    """
    sandbox = _check_args(
        sandbox,
        policy,
        proxy,
        mode,
        proxy_port,
        client_id,
        token,
        gateway,
        force,
        allow_privileged,
        cut_mode,
        helper_image,
    )
    route_texts = as_str_list(framework_routes, "prepare_execution framework_routes")
    blocked = as_str_list(expect_blocked, "prepare_execution expect_blocked")
    _check_extra_args(mode, transparent, transparent_port, dns_port, socks_port)
    routes = [parse_framework_route(r) for r in route_texts]
    reg = _registry(proxy)
    prior = reg.sandboxes.get(sandbox)
    cid = client_id or (prior.client_id if prior else _client_id(sandbox))
    tok = token or (prior.token if prior else secrets.token_urlsafe(24))
    _refuse_taken(proxy, reg, sandbox, cid, mode, prior)
    _refuse_new_keeps(sandbox, prior, routes, proxy_port)
    sandbox_policy = Policy(
        allow=policy.allow_rules,
        block=policy.block_rules,
        default=policy.default,
        framework_routes=[*policy.framework_routes, *routes],
        report_only=policy.report_only,
    )
    # counted from before the cut, so the probe's own connections are in the summary
    # whenever they are recorded (release_execution returns it: docs/metrics.md)
    tracking = prior is None or cid not in proxy.observers.summaries
    if tracking:
        proxy.track_execution(cid)
    proxy.heap.enter()  # a burst settles the heap when it ends: docs/proxy.md#garbage-collection
    try:
        box = await _bind(
            proxy,
            reg,
            sandbox,
            cid,
            tok,
            sandbox_policy,
            routes,
            mode,
            proxy_port,
            gateway,
            prior,
            cut_mode,
        )
        assert box.main is not None
        listeners = [box.main, *(box.forwarders[(r.host, r.port)] for r in routes)]
        ports = (transparent_port, dns_port) if transparent else None
        extra = await _extras(proxy, reg, box, ports, socks_port)
        # gateway mode keeps every listener it opened on the gateway (a SOCKS5 one too)
        kept = (*listeners, *extra) if mode == "gateway" else ()
        keeps = [f"{li.host}:{li.port}" for li in kept]
        redirect = None
        if transparent:
            redirect, blocked = (extra[0].port, extra[1].port), []
        for li in extra:  # the probe below connects to them: audited as the probe it is
            li.probing = True
        try:
            cut, probe = await _cut_and_prove(
                sandbox,
                keeps,
                [f"{li.host}:{li.port}" for li in (*listeners, *extra)],
                blocked,
                force=force,
                allow_privileged=allow_privileged,
                redirect=redirect,
                cut_mode=cut_mode,
                helper_image=helper_image,
            )
        finally:
            for li in extra:
                li.probing = False
    except BaseException as exc:
        _release_sandbox(proxy, reg, sandbox, why=f"prepare failed: {exc}")
        if tracking:
            proxy.execution_summary(cid, stop=True)
        if isinstance(exc, ExecutionNotReady | asyncio.CancelledError) or not isinstance(
            exc, Exception
        ):
            raise
        raise ExecutionNotReady(f"sandbox {sandbox}: {exc}", not_ready_kind(exc)) from exc
    finally:
        proxy.heap.leave()
    _audit(
        proxy,
        sandbox,
        cid,
        "sandbox_replaced" if prior else "sandbox_added",
        f"policy {sandbox_policy!r}",
    )
    execution = _execution(sandbox, cid, tok, mode, routes, listeners, cut, probe)
    return replace(
        execution,
        listeners=(*execution.listeners, *extra),
        cut_mode=cut_mode,
        helper_image=helper_image,
    )


def update_execution(proxy: EgressProxy, execution: Execution, policy: Policy) -> None:
    """Replace a running execution's policy at once (docs/user-guide.md#live-policy).

    `policy` is the new composed policy; the execution's framework routes are added as in
    `prepare_execution`. From the next request on, the sandbox is judged by it; its open
    tunnels are judged again and those it no longer allows closed (`end: revoked`,
    docs/policy.md#live-policy-changes). The audit log records the new policy's
    hash. Raises KeyError when the execution is no longer served by `proxy`."""
    as_instance(proxy, "update_execution proxy", EgressProxy, "an EgressProxy")
    as_instance(execution, "update_execution execution", Execution, "an Execution")
    as_instance(policy, "update_execution policy", Policy, "a Policy")
    routes = [parse_framework_route(r) for r in execution.framework_urls]
    sandbox_policy = Policy(
        allow=policy.allow_rules,
        block=policy.block_rules,
        default=policy.default,
        framework_routes=[*policy.framework_routes, *routes],
        report_only=policy.report_only,
    )
    proxy.set_client_policy(execution.client_id, sandbox_policy)


async def release_execution(
    proxy: EgressProxy,
    execution: Execution,
    *,
    restore: bool = False,
    cut_mode: CutMode | None = None,
    forget: bool = False,
) -> ExecutionSummary:
    """Release the sandbox: its client, token, source addresses, listeners and forwarders
    (a listener shared with another sandbox stays until its last holder is released), and,
    with `restore`, undo the cut.

    Without `restore`, netcut's record of the cut is removed when `forget` is True (a
    sandbox that will be destroyed: nothing is left behind) or when the namespace is already
    gone; otherwise it stays, so a later `netcut restore` can still undo the cut. Records
    of namespaces destroyed later are collected by netcut (`netcut gc`, and at a later cut:
    docs/netcut.md#collecting-records).

    Returns what the execution did: its access records counted by decision, host and reason
    (`ExecutionSummary`, e.g. `summary.blocked_hosts` for "this run tried 3 blocked hosts").
    Idempotent. Raises `ReleaseFailed` (the netcut error chained) when `restore` cannot
    undo the cut: the caller must know the namespace is still cut, or not restored.

    The restore runs in `cut_mode`, by default the mode the execution was cut in. Either
    mode restores a cut made by the other (netcut keys its records by the namespace:
    docs/netcut.md#one-algorithm), so a host that can enter the namespace may restore a
    helper cut directly.
    """
    as_instance(proxy, "release_execution proxy", EgressProxy, "an EgressProxy")
    as_instance(execution, "release_execution execution", Execution, "an Execution")
    as_bool(restore, "release_execution restore")
    as_bool(forget, "release_execution forget")
    if restore and forget:
        raise ValueError("release_execution: restore and forget exclude each other")
    how = execution.cut_mode if cut_mode is None else cut_mode
    if as_choice(how, "release_execution cut_mode", CUT_MODES) == "helper" and restore:
        if parse_target(execution.sandbox).kind != "container":
            raise ValueError(
                f"release_execution cut_mode='helper' needs a container sandbox, "
                f"not {execution.sandbox!r}"
            )
    summary = proxy.execution_summary(execution.client_id, stop=True)
    reg = _registry(proxy)
    if not _release_sandbox(proxy, reg, execution.sandbox, why="released"):
        for listener in execution.listeners:  # an execution from before a failed re-prepare
            if not reg.leases.holders(listener):
                proxy.remove_listener(listener)
    if restore:
        import netcut

        try:
            if how == "helper":
                from netcut.helper import mode as helper

                ref = parse_target(execution.sandbox)
                image = execution.helper_image
                await asyncio.to_thread(functools.partial(helper.restore, ref, image=image))
            else:
                await netcut.restore_async(execution.sandbox)
        except netcut.NetcutError as exc:
            raise ReleaseFailed(f"sandbox {execution.sandbox}: restore failed: {exc}") from exc
    else:
        await _forget_record(execution, forget)
    return summary


async def _forget_record(execution: Execution, forget: bool) -> None:
    """Remove the cut's record when asked to, or when its namespace is gone (the sandbox's
    namespace file no longer names the namespace that was cut)."""
    identity = getattr(execution.cut, "identity", None)
    if identity is None:
        return
    import netcut

    if not forget:
        path = parse_target(execution.sandbox).static_path
        if path is None:
            return  # a container: asking its runtime costs a process; netcut collects it later
        try:
            st = os.stat(path)
            if (st.st_dev, st.st_ino) == tuple(identity):
                return  # still there: the record stays for a later restore
        except OSError:
            pass
    try:
        await asyncio.to_thread(netcut.forget, tuple(identity))
    except netcut.NetcutError as exc:
        raise ReleaseFailed(f"sandbox {execution.sandbox}: forget failed: {exc}") from exc

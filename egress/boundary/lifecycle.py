"""The boundary's three calls: `prepare_execution`, `update_execution` and
`release_execution`.

`prepare_execution` joins the proxy (`egress`) and the cut (`netcut`):

 1. The sandbox gets a proxy listener on its *own loopback* (a socket created inside its
    namespace, served by this process's event loop), bound to its client id and policy, and a
    forwarder on its loopback for each framework route. No host port is exposed to any
    container, and the cut keeps nothing but loopback. (`mode="gateway"` instead listens on
    the host address the sandbox reaches the host by, and the cut keeps those ports.)
    The cut runs in netcut's direct mode (`cut_mode="direct"`: netcut's worker enters the
    namespace) or through a helper container (`cut_mode="helper"`, docs/netcut.md#helper-mode)
    for a host process that cannot enter it; helper mode goes with `mode="gateway"`, since a
    loopback listener is itself a socket opened inside the namespace
    (docs/user-guide.md#helper-mode).
 2. The namespace is cut (`netcut.cut`) and probed: the proxy and forwarders must answer from
    inside, and every `expect_blocked` address must not. The namespace must then report `cut`.
 3. Only then is the agent's environment returned. **Fail closed**: any failure raises
    `ExecutionNotReady` and no environment is handed out.

A sandbox is one object with one lifecycle (docs/user-guide.md#sandbox-lifecycle): prepared
(listeners, forwarders, client added), prepared again (its policy replaced atomically, its
listeners reused, the cut idempotent), released (everything it added removed; a gateway
listener shared with another sandbox is reference-counted and stays while that one is cut).
One shared proxy serves many sandboxes, each with its own listener, policy and token.

With `transparent=True` the sandbox also gets a transparent listener and a DNS responder on
its loopback, and the cut redirects every other TCP connection and every DNS query to them
(docs/proxy.md#transparent-mode-and-socks5), so tools that ignore proxy settings are judged
too; `socks_port` adds a SOCKS5 listener beside the proxy listener.

The package follows those steps (docs/architecture.md): `execution.py` (what is handed out,
the errors), `checks.py` (the arguments), `sandboxes.py` (the per-proxy registry, listeners
and leases), `gateway.py` (where the host and the sandbox are), `cutting.py` (cut, probe,
status; direct or helper) and `lifecycle.py` (the three calls).
"""

from __future__ import annotations

import asyncio
import errno
import functools
import os
from collections.abc import Iterable
from typing import Any

from netcut.targetref import TargetRef, parse_target

from ..policy.rules import Policy, parse_framework_route
from ..policy.target import bracket, join_host_port
from ..proxy.net.listener import ListenerProbe
from ..proxy.server import EgressProxy, Listener
from ..proxy.telemetry.observe import ExecutionSummary
from ..validate import as_bool, as_choice, as_instance
from .checks import Preparation, check_preparation
from .cutting import cut_and_prove
from .execution import (
    CUT_MODES,
    DNS_PORT,
    TRANSPARENT_PORT,
    CutMode,
    CutModeChoice,
    Execution,
    ExecutionNotReady,
    Mode,
    ReleaseFailed,
    Sandbox,
    agent_env,
    not_ready_kind,
    route_url,
)
from .passing import HelperCut
from .sandboxes import Sandboxes, Tenant, with_routes


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
    cut_mode: CutModeChoice = "auto",
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
    ask = check_preparation(
        sandbox,
        policy,
        proxy,
        framework_routes=framework_routes,
        expect_blocked=expect_blocked,
        mode=mode,
        proxy_port=proxy_port,
        client_id=client_id,
        token=token,
        gateway=gateway,
        force=force,
        allow_privileged=allow_privileged,
        cut_mode=cut_mode,
        helper_image=helper_image,
        transparent=transparent,
        transparent_port=transparent_port,
        dns_port=dns_port,
        socks_port=socks_port,
    )
    return await _prepare(ask)


async def _prepare(ask: Preparation) -> Execution:
    """Admit the sandbox, then open and cut; on any failure release what it holds in the
    proxy and raise `ExecutionNotReady` (fail closed: the cut, if applied, stays)."""
    proxy = ask.proxy
    sandboxes = Sandboxes(proxy)
    prior = sandboxes.get(ask.sandbox)
    tenant = sandboxes.admit(ask, prior)
    cid = tenant.client_id
    # counted from before the cut, so the probe's own connections are in the summary
    # whenever they are recorded (release_execution returns it: docs/metrics.md)
    tracking = prior is None or cid not in proxy.observers.summaries
    if tracking:
        proxy.track_execution(cid)
    proxy.heap.enter()  # a burst settles the heap when it ends: docs/proxy.md#garbage-collection
    try:
        execution = await _open_and_cut(sandboxes, ask, tenant, prior)
    except BaseException as exc:
        sandboxes.release(ask.sandbox, why=f"prepare failed: {exc}")
        if tracking:
            proxy.execution_summary(cid, stop=True)
        if isinstance(exc, ExecutionNotReady | asyncio.CancelledError) or not isinstance(
            exc, Exception
        ):
            raise
        kind = not_ready_kind(exc)
        why = f"sandbox {ask.sandbox}: {exc}"
        if kind in ("namespace", "no_privilege"):  # the fix is another mode, or root
            why += f" (cut_mode {ask.cut_mode!r}: {ask.cut_mode_reason})"
        elif ask.mode == "gateway" and getattr(exc, "errno", None) == errno.EADDRNOTAVAIL:
            gateway = f" {ask.gateway}" if ask.gateway else ""
            why += (
                f" (the sandbox's gateway{gateway} is not an address of this host's namespace, "
                "as with rootless podman: use mode='loopback', docs/user-guide.md#helper-mode)"
            )
        raise ExecutionNotReady(why, kind) from exc
    finally:
        proxy.heap.leave()
    why = "sandbox_replaced" if prior else "sandbox_added"
    sandboxes.audit(ask.sandbox, cid, why, f"policy {tenant.policy!r}")
    return execution


async def _open_and_cut(
    sandboxes: Sandboxes, ask: Preparation, tenant: Tenant, prior: Sandbox | None
) -> Execution:
    """Open (or reuse) the sandbox's listeners, then cut its namespace and prove the cut:
    the execution is made only from a proven cut. In helper mode with loopback listeners one
    helper run does both: it opens the listeners inside the namespace and passes them back,
    this loop serves them, then the same run cuts, probes and reports status (passing.py)."""
    if ask.cut_mode != "helper" or ask.mode != "loopback":
        return await _open_then_cut(sandboxes, ask, tenant, prior, None)
    async with HelperCut(ask) as run:
        held = [(li.kind, li.port) for li in sandboxes.leases.held(ask.sandbox)]
        sandboxes.supply = await run.supply(prior, held)
        try:
            return await _open_then_cut(sandboxes, ask, tenant, prior, run)
        finally:
            sandboxes.supply.close()  # whatever a failure left unadopted


async def _open_then_cut(
    sandboxes: Sandboxes,
    ask: Preparation,
    tenant: Tenant,
    prior: Sandbox | None,
    run: HelperCut | None,
) -> Execution:
    box = await sandboxes.bind(ask, tenant, prior)
    assert box.main is not None
    listeners = [box.main, *(box.forwarders[(r.host, r.port)] for r in ask.routes)]
    ports = (ask.transparent_port, ask.dns_port) if ask.transparent else None
    extra = await sandboxes.open_extras(box, ports, ask.socks_port)
    # gateway mode keeps every listener it opened on the gateway (a SOCKS5 one too)
    kept = (*listeners, *extra) if ask.mode == "gateway" else ()
    redirect, blocked = None, list(ask.expect_blocked)
    if ask.transparent:
        redirect, blocked = (extra[0].port, extra[1].port), []
    for li in extra:  # the probe below connects to them: audited as the probe it is
        li.probe = ListenerProbe()
    probe = None
    try:
        cut, probe = await cut_and_prove(
            ask.sandbox,
            [f"{li.host}:{li.port}" for li in kept],
            [f"{li.host}:{li.port}" for li in (*listeners, *extra)],
            blocked,
            force=ask.force,
            allow_privileged=ask.allow_privileged,
            redirect=redirect,
            cut_mode=ask.cut_mode,
            helper_image=ask.helper_image,
            run=run,
        )
    finally:
        for li in extra:
            assert li.probe is not None
            li.probe.finish(_probe_sources(probe, li))
    return _execution(ask, tenant, listeners, extra, (cut, probe))


def _probe_sources(probe: Any, li: Listener) -> list[str]:
    """The probe's own ends of its connections to `li` (netcut's `ProbeItem.source`)."""
    target = join_host_port(li.host, li.port)
    items = probe.items if probe is not None else ()
    return [i.source for i in items if i.target == target and i.source]


def _execution(
    ask: Preparation,
    tenant: Tenant,
    listeners: list[Listener],
    extra: list[Listener],
    proof: tuple[Any, Any],
) -> Execution:
    """What the agent is handed: the proxy URL with its credentials, its environment, and
    each framework route's URL as the sandbox reaches its forwarder."""
    cid, tok = tenant.client_id, tenant.token
    main = listeners[0]
    proxy_url = f"http://{cid}:{tok}@{bracket(main.host)}:{main.port}"
    urls = {
        r.text: route_url(r, li.host, li.port)
        for r, li in zip(ask.routes, listeners[1:], strict=True)
    }
    no_proxy = ["localhost", "127.0.0.1", "::1"] if ask.mode == "loopback" else [main.host]
    return Execution(
        ask.sandbox,
        cid,
        proxy_url,
        agent_env(proxy_url, no_proxy),
        urls,
        tok,
        *proof,
        listeners=(*listeners, *extra),
        cut_mode=ask.cut_mode,
        helper_image=ask.helper_image,
        cut_mode_reason=ask.cut_mode_reason,
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
    proxy.set_client_policy(execution.client_id, with_routes(policy, routes))


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
    sandboxes = Sandboxes(proxy)
    if not sandboxes.release(execution.sandbox, why="released"):
        for listener in execution.listeners:  # an execution from before a failed re-prepare
            if not sandboxes.leases.holders(listener):
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

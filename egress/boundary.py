"""The execution boundary: the one call a framework makes right before its agent starts.

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
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import os
import secrets
import socket
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from netcut.errors import InvalidInput
from netcut.targetref import TargetRef, canonical, default_client_id, parse_target

from .config import ClientSpec
from .errors import EgressError
from .policy.rules import FrameworkRoute, Policy, parse_framework_route
from .policy.target import IPNetwork, bracket, join_host_port
from .proxy.clients import Identity, Leases
from .proxy.observe import ExecutionSummary
from .proxy.server import EgressProxy, Listener
from .validate import as_bool, as_choice, as_count, as_instance, as_str, as_str_list

Mode = Literal["loopback", "gateway"]
CutMode = Literal["direct", "helper"]  # netcut's `--mode` (docs/netcut.md#helper-mode)
CUT_MODES = ("direct", "helper")
PROXY_ENV = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
# Transparent mode's in-namespace ports (on the sandbox's own 127.0.0.1)
TRANSPARENT_PORT = 15001
DNS_PORT = 15053


class ExecutionNotReady(EgressError):
    """The boundary could not be proven (cut, probe or listener failed): do not run the agent."""


class ReleaseFailed(EgressError):
    """`release_execution(restore=True)` could not undo the cut (the cause is chained)."""


@dataclass(frozen=True)
class Execution:
    """What the agent needs: its environment and the framework URLs as it must use them."""

    sandbox: str
    client_id: str
    proxy_url: str
    env: Mapping[str, str]
    framework_urls: Mapping[str, str]
    token: str
    cut: Any = None  # netcut.CutResult
    probe: Any = None  # netcut.ProbeResult
    listeners: tuple[Listener, ...] = field(default=(), repr=False)
    cut_mode: CutMode = "direct"  # how it was cut, and how `release_execution` restores it
    helper_image: str | None = field(default=None, repr=False)


def _client_id(sandbox: str) -> str:
    """The default client id: the namespace's name, `pid-N`, `RUNTIME-ID`, or for any other
    namespace file `netns-INODE` (netcut.targetref.default_client_id), never `net` for
    every /proc/N/ns/net."""
    ref = parse_target(sandbox)
    inode = None
    if ref.kind == "path":
        with contextlib.suppress(OSError):
            inode = os.stat(ref.value).st_ino
    return default_client_id(ref, inode)


def agent_env(proxy_url: str, no_proxy: Sequence[str]) -> dict[str, str]:
    """HTTP_PROXY, HTTPS_PROXY, ALL_PROXY and NO_PROXY, upper and lower case."""
    env: dict[str, str] = {}
    for name in PROXY_ENV:
        env[name] = env[name.lower()] = proxy_url
    joined = ",".join(dict.fromkeys(no_proxy))
    env["NO_PROXY"] = env["no_proxy"] = joined
    return env


def _rewrite(route: FrameworkRoute, host: str, port: int) -> str:
    """`route`'s URL with its authority replaced by `host:port` (path and scheme kept)."""
    scheme, rest = route.text.split("://", 1)
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    return f"{scheme}://{join_host_port(host, port)}{rest[cut:]}"


@dataclass(eq=False)
class _Sandbox:
    """What the proxy holds for one prepared sandbox (docs/user-guide.md#sandbox-lifecycle)."""

    key: str
    client_id: str
    mode: Mode
    token: str
    proxy_port: int
    main: Listener | None
    forwarders: dict[tuple[str, int], Listener]


@dataclass(eq=False)
class _Registry:
    """The sandboxes one proxy serves, and which of them holds which listener."""

    sandboxes: dict[str, _Sandbox] = field(default_factory=dict)
    leases: Leases[Listener] = field(default_factory=Leases)


_REGISTRIES: weakref.WeakKeyDictionary[EgressProxy, _Registry] = weakref.WeakKeyDictionary()


def _registry(proxy: EgressProxy) -> _Registry:
    reg = _REGISTRIES.get(proxy)
    if reg is None:
        reg = _REGISTRIES[proxy] = _Registry()
    return reg


def _check_args(
    sandbox: object, policy: object, proxy: object, mode: object, proxy_port: object,
    client_id: object, token: object, gateway: object, force: object, allow_privileged: object,
    cut_mode: object, helper_image: object,
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
    sandbox = _check_args(sandbox, policy, proxy, mode, proxy_port, client_id, token, gateway,
                          force, allow_privileged, cut_mode, helper_image)
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
        allow=policy.allow_rules, block=policy.block_rules, default=policy.default,
        framework_routes=[*policy.framework_routes, *routes], report_only=policy.report_only,
    )
    try:
        box = await _bind(proxy, reg, sandbox, cid, tok, sandbox_policy, routes, mode,
                          proxy_port, gateway, prior, cut_mode)
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
        cut, probe = await _cut_and_prove(
            sandbox, keeps, [f"{li.host}:{li.port}" for li in (*listeners, *extra)], blocked,
            force=force, allow_privileged=allow_privileged, redirect=redirect,
            cut_mode=cut_mode, helper_image=helper_image,
        )
    except BaseException as exc:
        _release_sandbox(proxy, reg, sandbox, why=f"prepare failed: {exc}")
        if isinstance(exc, ExecutionNotReady | asyncio.CancelledError) or not isinstance(
            exc, Exception
        ):
            raise
        raise ExecutionNotReady(f"sandbox {sandbox}: {exc}") from exc
    _audit(proxy, sandbox, cid, "sandbox_replaced" if prior else "sandbox_added",
           f"policy {sandbox_policy!r}")
    if prior is None or cid not in proxy.observers.summaries:
        proxy.track_execution(cid)  # release_execution returns the summary (docs/metrics.md)
    execution = _execution(sandbox, cid, tok, mode, routes, listeners, cut, probe)
    return replace(execution, listeners=(*execution.listeners, *extra), cut_mode=cut_mode,
                   helper_image=helper_image)


def _check_extra_args(
    mode: str, transparent: object, transparent_port: object, dns_port: object,
    socks_port: object,
) -> None:
    as_bool(transparent, "prepare_execution transparent")
    for label, value in (("transparent_port", transparent_port), ("dns_port", dns_port),
                         ("socks_port", socks_port)):
        if value is not None and as_count(value, f"prepare_execution {label}", minimum=0) > 65535:
            raise ValueError(f"prepare_execution {label} must be at most 65535, not {value}")
    if transparent and mode != "loopback":
        raise ValueError("prepare_execution transparent needs mode='loopback' (its listeners "
                         "live on the sandbox's own loopback)")


async def _extras(
    proxy: EgressProxy, reg: _Registry, box: _Sandbox, transparent: tuple[int, int] | None,
    socks_port: int | None,
) -> list[Listener]:
    """Transparent mode's listener and DNS responder (one fake-IP map between them) and the
    SOCKS5 listener, on the sandbox's loopback (or the gateway listener's address for SOCKS5
    in gateway mode); reused from a previous prepare, bound to the sandbox's current policy,
    and the ones no longer asked for released."""
    from .proxy.dnsanswer import FakeIPs
    from .proxy.dnsserve import open_dns

    assert box.main is not None
    loopback = box.mode == "loopback"
    netns = box.main.netns if loopback else None
    held = {li.kind: li for li in reg.leases.held(box.key) if li.kind != "http"}
    identity = box.main.identity  # loopback: the sandbox's; gateway: None (token or source)
    out: list[Listener] = []
    if transparent is not None:
        listener, dns = held.get("transparent"), held.get("dns")
        if listener is None or dns is None:
            assert identity is not None
            fake_ips = FakeIPs()
            listener = await proxy.add_listener(
                f"127.0.0.1:{transparent[0]}", netns=netns, kind="transparent",
                client=ClientSpec(box.client_id, identity.policy),
            )
            listener.fake_ips = fake_ips
            reg.leases.hold(box.key, listener)
            dns = await open_dns(proxy, f"127.0.0.1:{transparent[1]}", identity=identity,
                                 fake_ips=fake_ips, netns=netns)
            reg.leases.hold(box.key, dns)
        out += [listener, dns]
    if socks_port is not None:
        socks = held.get("socks5")
        if socks is None or socks.port not in (0, socks_port):
            socks = await proxy.add_listener(join_host_port(box.main.host, socks_port), netns=netns,
                                             kind="socks5")
            reg.leases.hold(box.key, socks)
        out.append(socks)
    for li in out:
        li.identity = identity
    for old in held.values():
        if old not in out and reg.leases.let_go(box.key, old):
            proxy.remove_listener(old)
    return out


def _refuse_taken(
    proxy: EgressProxy, reg: _Registry, sandbox: str, cid: str, mode: str, prior: _Sandbox | None
) -> None:
    """A client id belongs to one sandbox (or one configured client), and a sandbox keeps
    its mode: checked before anything is opened, so a refusal changes nothing."""
    for other in reg.sandboxes.values():
        if other.client_id == cid and other.key != sandbox:
            raise ExecutionNotReady(f"sandbox {sandbox}: client id {cid!r} is already used by "
                                    f"sandbox {other.key}")
    owned = prior is not None and prior.client_id == cid
    if mode == "gateway" and not owned and proxy.clients.spec(cid) is not None:
        raise ExecutionNotReady(f"sandbox {sandbox}: client id {cid!r} is a configured client")
    if prior is not None and prior.mode != mode:
        raise ExecutionNotReady(f"sandbox {sandbox}: already prepared in {prior.mode} mode; "
                                "release it first")


def _refuse_new_keeps(sandbox: str, prior: _Sandbox | None, routes: Sequence[FrameworkRoute],
                      proxy_port: int) -> None:
    """In gateway mode the cut keeps the listeners' ports, and a cut namespace is never
    re-cut with other keeps (that would open it in between): a second prepare may change
    the policy, not the routes or the port (docs/user-guide.md#sandbox-lifecycle)."""
    if prior is None or prior.mode != "gateway":
        return
    if set(prior.forwarders) != {(r.host, r.port) for r in routes} or (
        proxy_port != prior.proxy_port
    ):
        raise ExecutionNotReady(
            f"sandbox {sandbox}: a gateway sandbox keeps its framework routes and proxy port; "
            "release it with restore=True first"
        )


async def _bind(
    proxy: EgressProxy, reg: _Registry, sandbox: str, cid: str, tok: str, policy: Policy,
    routes: Sequence[FrameworkRoute], mode: Mode, proxy_port: int, gateway: str | None,
    prior: _Sandbox | None, cut_mode: CutMode,
) -> _Sandbox:
    """Open (or reuse) the sandbox's listeners and bind its policy to them in one step.
    In helper mode the gateway and the sandbox's addresses come from its runtime's
    `inspect`, never from inside the namespace (docs/user-guide.md#helper-mode)."""
    net = await _container_network(sandbox) if cut_mode == "helper" else None
    if mode == "loopback":
        host, netns = "127.0.0.1", await _namespace_file(sandbox)
    else:
        # once cut, the sandbox has no default route left to find the host by: keep the first
        known = prior.main.host if prior and prior.main else None
        found = gateway or known
        if found is None:
            found = _inspected_gateway(sandbox, net) if net else await _gateway_of(sandbox)
        host, netns = found, None
    box = _Sandbox(sandbox, cid, mode, tok, proxy_port, prior.main if prior else None, {})
    if prior is None:
        reg.sandboxes[sandbox] = box
    box.main = await _main_listener(proxy, reg, box, host, netns, prior)
    box.forwarders = await _forwarders(proxy, reg, box, routes, host, netns, prior)
    # the policy switch: one assignment (loopback) or one table swap (gateway)
    if mode == "loopback":
        box.main.identity = Identity(cid, policy)
        proxy._policy_applied(cid, policy, "sandbox")  # docs/policy.md#policy-hash
    else:
        sources = _inspected_sources(net) if net else await _sandbox_sources(sandbox)
        proxy.add_client(ClientSpec(cid, policy, token=tok, sources=sources))
    reg.sandboxes[sandbox] = box
    # transparent mode's and SOCKS5 listeners are _extras' to keep or let go
    extras = {li for li in reg.leases.held(sandbox) if li.kind != "http"}
    used = {box.main, *box.forwarders.values(), *extras}
    for old in reg.leases.held(sandbox):
        if old not in used and reg.leases.let_go(sandbox, old):
            proxy.remove_listener(old)
    return box


async def _namespace_file(sandbox: str) -> str:
    """Where the sandbox's listeners open: the sandbox itself when naming its namespace file
    costs nothing (a name, a PID, a path); a container's /proc/PID/ns/net, asked of its
    runtime off the event loop (`docker inspect` takes ~0.1 s, `podman info` ~0.7 s)."""
    if parse_target(sandbox).kind != "container":
        return sandbox
    from .proxy.netns import namespace_path

    return await asyncio.to_thread(namespace_path, sandbox)


async def _main_listener(
    proxy: EgressProxy, reg: _Registry, box: _Sandbox, host: str, netns: str | None,
    prior: _Sandbox | None,
) -> Listener:
    """The sandbox's proxy listener: its own (loopback) or a shared one (gateway)."""
    port = box.proxy_port
    if prior and prior.main and prior.proxy_port == port and prior.main.host == host:
        return prior.main
    if box.mode == "gateway":
        for li in proxy.listeners:
            if li.netns is None and li.host == host and li.forward_to is None:
                ours = bool(reg.leases.holders(li))
                if ours and port in (0, li.port):
                    reg.leases.hold(box.key, li)
                    return li
                if not ours and li.identity is None and li.port == port:
                    return li  # the proxy's own listener: shared, never closed by a release
    li = await proxy.add_listener(f"{bracket(host)}:{port}", netns=netns)
    reg.leases.hold(box.key, li)
    return li


async def _forwarders(
    proxy: EgressProxy, reg: _Registry, box: _Sandbox, routes: Sequence[FrameworkRoute],
    host: str, netns: str | None, prior: _Sandbox | None,
) -> dict[tuple[str, int], Listener]:
    """One forwarder per route, reused from this sandbox (or, on a gateway, any sandbox)."""
    out: dict[tuple[str, int], Listener] = {}
    mine = dict(prior.forwarders) if prior else {}
    used = {li.port for li in proxy.listeners if li.netns == netns and li.host == host}
    for route in routes:
        key = (route.host, route.port)
        found = mine.get(key)
        if found is None and box.mode == "gateway":
            found = next((li for li in proxy.listeners if li.netns is None and li.host == host
                          and li.forward_to == key and reg.leases.holders(li)), None)
        if found is None or found not in proxy.listeners:
            port = route.port if route.port not in used else 0
            cid = box.client_id if box.mode == "loopback" else None  # a shared one is nobody's
            found = await proxy.add_forwarder(f"{bracket(host)}:{port}", route.text, netns=netns,
                                              client_id=cid)
        reg.leases.hold(box.key, found)
        used.add(found.port)
        out[key] = found
    return out


def _execution(
    sandbox: str, cid: str, tok: str, mode: Mode, routes: Sequence[FrameworkRoute],
    listeners: Sequence[Listener], cut: Any, probe: Any,
) -> Execution:
    proxy_listener = listeners[0]
    host = proxy_listener.host
    proxy_url = f"http://{cid}:{tok}@{bracket(host)}:{proxy_listener.port}"
    urls = {
        r.text: _rewrite(r, li.host, li.port) for r, li in zip(routes, listeners[1:], strict=True)
    }
    no_proxy = ["localhost", "127.0.0.1", "::1"] if mode == "loopback" else [host]
    return Execution(
        sandbox, cid, proxy_url, agent_env(proxy_url, no_proxy), urls, tok, cut, probe,
        tuple(listeners),
    )


def _release_sandbox(proxy: EgressProxy, reg: _Registry, sandbox: str, *, why: str) -> bool:
    """Remove everything `sandbox` added: its client (token, sources), and every listener and
    forwarder no other sandbox holds. Idempotent; False if it was not prepared."""
    box = reg.sandboxes.pop(sandbox, None)
    for listener in reg.leases.drop(sandbox):
        proxy.remove_listener(listener)
    if box is None:
        return False
    if box.mode == "gateway":
        proxy.remove_client(box.client_id)
    elif box.main is not None:
        box.main.identity = None  # a connection still open on it is nobody's any more
    _audit(proxy, sandbox, box.client_id, "sandbox_removed", why)
    return True


def _audit(proxy: EgressProxy, sandbox: str, cid: str, reason: str, detail: str) -> None:
    """One lifecycle record (method `SANDBOX`, docs/audit-log.md#sandbox-records)."""
    event: dict[str, object] = {
        "client": "-", "method": "SANDBOX", "scheme": "", "host": sandbox, "port": 0,
        "client_id": cid, "decision": "block" if reason == "sandbox_removed" else "allow",
        "reason": reason, "rule": None, "detail": detail,
    }
    if proxy.audit is not None:
        proxy.audit.record(event)
    for hook in proxy.hooks:
        hook(event)


async def _cut_and_prove(
    sandbox: str, keeps: Sequence[str], reachable: Sequence[str], blocked: Iterable[str], *,
    force: bool, allow_privileged: bool, redirect: tuple[int, int] | None = None,
    cut_mode: CutMode = "direct", helper_image: str | None = None,
) -> tuple[Any, Any]:
    import netcut
    from netcut.redirect import Redirect

    try:
        if cut_mode == "helper":
            cut, probe, status = await _helper_cut(
                sandbox, keeps, reachable, list(blocked), allow_privileged, helper_image
            )
        else:
            cut = await netcut.cut_async(
                sandbox, keeps, probe=False, force=force, allow_privileged=allow_privileged,
                redirect=Redirect(*redirect) if redirect is not None else None,
            )
            probe = await netcut.probe_async(sandbox, reachable, list(blocked))
            status = await netcut.status_async(sandbox)
    except netcut.NetcutError as exc:
        raise ExecutionNotReady(f"sandbox {sandbox}: {exc}") from exc
    if probe is None or not probe.ok:
        why = probe.reason() if probe is not None else "nothing was probed"
        raise ExecutionNotReady(f"sandbox {sandbox}: probe failed: {why}")
    if not _is_cut(status):
        raise ExecutionNotReady(f"sandbox {sandbox}: status after the cut is {status}")
    return cut, probe


async def _helper_cut(
    sandbox: str, keeps: Sequence[str], reachable: Sequence[str], blocked: list[str],
    allow_privileged: bool, image: str | None,
) -> tuple[Any, Any, Any]:
    """Cut, probe and status in one helper run (docs/netcut.md#helper-mode): the probe runs
    from inside the namespace and checks every kept ADDR:PORT (in gateway mode exactly the
    listeners) and every `blocked` one; the status then reads the whole live state, as
    direct mode's does."""
    from netcut import helper

    assert set(reachable) <= set(keeps), "helper mode probes what it keeps (gateway mode)"
    cut, status = await asyncio.to_thread(
        functools.partial(helper.cut_and_status, parse_target(sandbox), tuple(keeps),
                          image=image, expect_blocked=tuple(blocked),
                          allow_privileged=allow_privileged)
    )
    return cut, cut.probe, status


def _is_cut(status: Any) -> bool:
    return bool(getattr(status, "is_cut", False))


Network = IPNetwork


async def _sandbox_sources(sandbox: str) -> tuple[Network, ...]:
    """The sandbox's own non-loopback addresses, as /32 (/128) source networks."""
    import asyncio

    from .proxy.hostaddrs import local_addresses
    from .proxy.netns import call_in_netns_thread

    found = await asyncio.to_thread(call_in_netns_thread, sandbox, local_addresses)
    return tuple(
        ipaddress.ip_network(a)
        for a in sorted(found, key=str)
        if not (a.is_loopback or a.is_link_local or a.is_unspecified)
    )


async def _container_network(sandbox: str) -> Any:
    """The container's networks as its runtime's `inspect` reports them (netcut.helper
    .ContainerNetwork), asked off the event loop; a netcut error is ExecutionNotReady."""
    from netcut import NetcutError, helper

    try:
        return await asyncio.to_thread(helper.inspect_network, parse_target(sandbox))
    except NetcutError as exc:
        raise ExecutionNotReady(f"sandbox {sandbox}: {exc}") from exc


def _inspected_gateway(sandbox: str, net: Any) -> str:
    """The one IPv4 gateway the runtime reports; none, or several (a container on two
    networks), is ExecutionNotReady asking for `gateway=`."""
    gateways: tuple[str, ...] = net.gateways
    if len(gateways) != 1:
        seen = ", ".join(gateways) or "none"
        raise ExecutionNotReady(
            f"sandbox {sandbox}: its runtime reports {len(gateways)} IPv4 gateways ({seen}); "
            "pass gateway= to choose the address the proxy listens on"
        )
    return gateways[0]


def _inspected_sources(net: Any) -> tuple[Network, ...]:
    """The sandbox's addresses from `inspect`, as /32 (/128) source networks."""
    return tuple(ipaddress.ip_network(a) for a in net.addresses)


async def _gateway_of(sandbox: str) -> str:
    """The IPv4 gateway of the sandbox's default route (the host as the sandbox sees it)."""
    import asyncio

    from .proxy.netns import call_in_netns_thread

    def read() -> str | None:
        # netcut's rtnetlink client, not pyroute2.IPRoute (netcut/rtnl.py says why)
        from netcut.rtnl import Rtnl

        with Rtnl() as rtnl:
            for route in rtnl.dump_routes():
                main = route.get_attr("RTA_TABLE") in (None, 254)
                if route["family"] == socket.AF_INET and route["dst_len"] == 0 and main:
                    gw = route.get_attr("RTA_GATEWAY")
                    if gw:
                        return str(gw)
        return None

    gw = await asyncio.to_thread(call_in_netns_thread, sandbox, read)
    if gw is None:
        raise ExecutionNotReady(f"sandbox {sandbox}: no IPv4 default route to find the host by")
    ipaddress.ip_address(gw)
    return gw


def update_execution(proxy: EgressProxy, execution: Execution, policy: Policy) -> None:
    """Replace a running execution's policy at once (docs/user-guide.md#live-policy).

    `policy` is the new composed policy; the execution's framework routes are added as in
    `prepare_execution`. From the next request on, the sandbox is judged by it; requests and
    tunnels already decided keep their decision. The audit log records the new policy's
    hash. Raises KeyError when the execution is no longer served by `proxy`."""
    routes = [parse_framework_route(r) for r in execution.framework_urls]
    sandbox_policy = Policy(
        allow=policy.allow_rules, block=policy.block_rules, default=policy.default,
        framework_routes=[*policy.framework_routes, *routes], report_only=policy.report_only,
    )
    proxy.set_client_policy(execution.client_id, sandbox_policy)


async def release_execution(
    proxy: EgressProxy, execution: Execution, *, restore: bool = False,
    cut_mode: CutMode | None = None,
) -> ExecutionSummary:
    """Release the sandbox: its client, token, source addresses, listeners and forwarders
    (a listener shared with another sandbox stays until its last holder is released), and,
    with `restore`, undo the cut.

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
    how = execution.cut_mode if cut_mode is None else cut_mode
    if as_choice(how, "release_execution cut_mode", CUT_MODES) == "helper" and restore:
        if parse_target(execution.sandbox).kind != "container":
            raise ValueError(f"release_execution cut_mode='helper' needs a container sandbox, "
                             f"not {execution.sandbox!r}")
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
                from netcut import helper

                ref = parse_target(execution.sandbox)
                image = execution.helper_image
                await asyncio.to_thread(functools.partial(helper.restore, ref, image=image))
            else:
                await netcut.restore_async(execution.sandbox)
        except netcut.NetcutError as exc:
            raise ReleaseFailed(f"sandbox {execution.sandbox}: restore failed: {exc}") from exc
    return summary

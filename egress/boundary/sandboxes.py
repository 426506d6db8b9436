"""The sandboxes one proxy serves (docs/user-guide.md#sandbox-lifecycle): the per-proxy
registry, which sandbox holds which listener (shared gateway listeners reference-counted),
opening or reusing a sandbox's listeners and binding its policy to them, and releasing
everything it added, each step audited."""

from __future__ import annotations

import asyncio
import errno
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field

from netcut.targetref import parse_target

from ..config import ClientSpec
from ..policy.rules import FrameworkRoute, Policy
from ..policy.target import bracket, join_host_port
from ..proxy.core.clients import Identity, Leases
from ..proxy.server import EgressProxy, Listener
from .execution import (
    CutMode,
    ExecutionNotReady,
    Mode,
)
from .gateway import (
    _container_network,
    _gateway_of,
    _inspected_gateway,
    _inspected_sources,
    _sandbox_sources,
)


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


async def _extras(
    proxy: EgressProxy,
    reg: _Registry,
    box: _Sandbox,
    transparent: tuple[int, int] | None,
    socks_port: int | None,
) -> list[Listener]:
    """Transparent mode's listener and DNS responder (one fake-IP map between them) and the
    SOCKS5 listener, on the sandbox's loopback (or the gateway listener's address for SOCKS5
    in gateway mode); reused from a previous prepare, bound to the sandbox's current policy,
    and the ones no longer asked for released."""
    from ..proxy.codec.dns import FakeIPs
    from ..proxy.modes.dns.serve import open_dns

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
                f"127.0.0.1:{transparent[0]}",
                netns=netns,
                kind="transparent",
                client=ClientSpec(box.client_id, identity.policy),
            )
            listener.fake_ips = fake_ips
            reg.leases.hold(box.key, listener)
            dns = await open_dns(
                proxy,
                f"127.0.0.1:{transparent[1]}",
                identity=identity,
                fake_ips=fake_ips,
                netns=netns,
            )
            reg.leases.hold(box.key, dns)
        out += [listener, dns]
    if socks_port is not None:
        socks = held.get("socks5")
        if socks is None or socks.port not in (0, socks_port):
            socks = await proxy.add_listener(
                join_host_port(box.main.host, socks_port), netns=netns, kind="socks5"
            )
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
            raise ExecutionNotReady(
                f"sandbox {sandbox}: client id {cid!r} is already used by sandbox {other.key}",
                "client_id_taken",
            )
    owned = prior is not None and prior.client_id == cid
    if mode == "gateway" and not owned and proxy.clients.spec(cid) is not None:
        raise ExecutionNotReady(
            f"sandbox {sandbox}: client id {cid!r} is a configured client", "client_id_taken"
        )
    if prior is not None and prior.mode != mode:
        raise ExecutionNotReady(
            f"sandbox {sandbox}: already prepared in {prior.mode} mode; release it first",
            "already_prepared",
        )


def _refuse_new_keeps(
    sandbox: str, prior: _Sandbox | None, routes: Sequence[FrameworkRoute], proxy_port: int
) -> None:
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
            "release it with restore=True first",
            "already_prepared",
        )


async def _bind(
    proxy: EgressProxy,
    reg: _Registry,
    sandbox: str,
    cid: str,
    tok: str,
    policy: Policy,
    routes: Sequence[FrameworkRoute],
    mode: Mode,
    proxy_port: int,
    gateway: str | None,
    prior: _Sandbox | None,
    cut_mode: CutMode,
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
        proxy.tenants.policy_applied(cid, policy, "sandbox")  # docs/policy.md#policy-hash
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
    from ..proxy.net.netns import namespace_path

    return await asyncio.to_thread(namespace_path, sandbox)


async def _main_listener(
    proxy: EgressProxy,
    reg: _Registry,
    box: _Sandbox,
    host: str,
    netns: str | None,
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
    proxy: EgressProxy,
    reg: _Registry,
    box: _Sandbox,
    routes: Sequence[FrameworkRoute],
    host: str,
    netns: str | None,
    prior: _Sandbox | None,
) -> dict[tuple[str, int], Listener]:
    """One forwarder per route, reused from this sandbox (or, on a gateway, any sandbox)."""
    out: dict[tuple[str, int], Listener] = {}
    mine = dict(prior.forwarders) if prior else {}
    used = {li.port for li in proxy.listeners if li.netns == netns and li.host == host}
    for route in routes:
        key = (route.host, route.port)
        found = mine.get(key)
        if found is None and box.mode == "gateway":
            found = next(
                (
                    li
                    for li in proxy.listeners
                    if li.netns is None
                    and li.host == host
                    and li.forward_to == key
                    and reg.leases.holders(li)
                ),
                None,
            )
        if found is None or found not in proxy.listeners:
            cid = box.client_id if box.mode == "loopback" else None  # a shared one is nobody's
            found = await _open_forwarder(proxy, route, host, netns, cid, used)
        reg.leases.hold(box.key, found)
        used.add(found.port)
        out[key] = found
    return out


async def _open_forwarder(
    proxy: EgressProxy,
    route: FrameworkRoute,
    host: str,
    netns: str | None,
    cid: str | None,
    used: set[int],
) -> Listener:
    """A forwarder on the route's own port when it is free, else on a port the kernel picks
    (docs/proxy.md#listening-inside-a-namespace-framework-route-forwarders). Free means
    neither one of our listeners there nor any other socket bound in the sandbox (a
    framework's own in-sandbox service, the agent's server), which only the bind itself can
    tell (EADDRINUSE). The `Execution`'s `framework_urls` name the port chosen."""
    if route.port not in used:
        try:
            return await proxy.add_forwarder(
                f"{bracket(host)}:{route.port}", route.text, netns=netns, client_id=cid
            )
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
    return await proxy.add_forwarder(f"{bracket(host)}:0", route.text, netns=netns, client_id=cid)


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
        "client": "-",
        "method": "SANDBOX",
        "scheme": "",
        "host": sandbox,
        "port": 0,
        "client_id": cid,
        "decision": "block" if reason == "sandbox_removed" else "allow",
        "reason": reason,
        "rule": None,
        "detail": detail,
    }
    if proxy.audit is not None:
        proxy.audit.record(event)
    for hook in proxy.hooks:
        hook(event)

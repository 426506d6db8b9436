"""The execution boundary: the one call a framework makes right before its agent starts.

`prepare_execution` joins the proxy (`egress`) and the cut (`netcut`):

 1. The sandbox gets a proxy listener on its *own loopback* (a socket created inside its
    namespace, served by this process's event loop), bound to its client id and policy, and a
    forwarder on its loopback for each framework route. No host port is exposed to any
    container, and the cut keeps nothing but loopback. (`mode="gateway"` instead listens on
    the host address the sandbox reaches the host by, and the cut keeps those ports.)
 2. The namespace is cut (`netcut.cut`) and probed: the proxy and forwarders must answer from
    inside, and every `expect_blocked` address must not. The namespace must then report `cut`.
 3. Only then is the agent's environment returned. **Fail closed**: any failure raises
    `ExecutionNotReady` and no environment is handed out.

With `transparent=True` the sandbox also gets a transparent listener and a DNS responder on
its loopback, and the cut redirects every other TCP connection and every DNS query to them
(docs/proxy.md#transparent-mode-and-socks5), so tools that ignore proxy settings are judged
too. Calling it twice for the same sandbox is safe (listeners are reused, the cut is idempotent).
One shared proxy serves many sandboxes, each with its own listener, policy and token.
"""

from __future__ import annotations

import contextlib
import ipaddress
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .config import ClientSpec
from .errors import EgressError
from .policy import FrameworkRoute, Policy, parse_framework_route
from .server import EgressProxy, Listener

Mode = Literal["loopback", "gateway"]
# Transparent mode's in-namespace ports (on the sandbox's own 127.0.0.1)
TRANSPARENT_PORT = 15001
DNS_PORT = 15053
PROXY_ENV = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")


class ExecutionNotReady(EgressError):
    """The boundary could not be proven (cut, probe or listener failed): do not run the agent."""


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


def _client_id(sandbox: str) -> str:
    return sandbox.rstrip("/").rsplit("/", 1)[-1]


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
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}:{port}{rest[cut:]}"


async def prepare_execution(
    sandbox: str,
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
    transparent: bool = False,
    transparent_port: int = TRANSPARENT_PORT,
    dns_port: int = DNS_PORT,
    socks_port: int | None = None,
) -> Execution:
    """Make `sandbox` (a namespace name, path or PID) reachable only through `proxy`.

    `policy` is the composed policy for this sandbox (see `egress.compose`); the framework
    routes are added to it. `transparent` (loopback mode only) also redirects every TCP
    connection and DNS query of the sandbox to the proxy; `expect_blocked` is not probed
    then (every destination reaches the proxy by design, which judges it). `socks_port`
    also opens a SOCKS5 listener beside the proxy listener (bound to this sandbox like it).
    Returns the agent's `Execution`. Raises `ExecutionNotReady` if any step fails, with the
    cause chained; nothing is handed out then.
    """
    routes = [parse_framework_route(r) for r in framework_routes]
    cid = client_id or _client_id(sandbox)
    tok = token or secrets.token_urlsafe(24)
    sandbox_policy = Policy(
        allow=policy.allow_rules, block=policy.block_rules, default=policy.default,
        framework_routes=[*policy.framework_routes, *routes],
    )  # fmt: skip
    spec = ClientSpec(cid, sandbox_policy, token=tok)
    keeps: list[str] = []
    netns: str | None = sandbox
    redirect = None
    try:
        if transparent and mode != "loopback":
            raise ExecutionNotReady("transparent mode needs mode='loopback' (its listeners "
                                    "live on the sandbox's own loopback)")  # fmt: skip
        if mode == "loopback":
            listen_host = "127.0.0.1"
        else:
            listen_host = gateway or await _gateway_of(sandbox)
            netns = None
        listeners = await _listeners(proxy, spec, routes, listen_host, proxy_port, netns)
        extra: list[Listener] = []
        if transparent:
            extra = await _transparent_listeners(proxy, spec, sandbox, transparent_port,
                                                 dns_port)  # fmt: skip
            redirect = (extra[0].port, extra[1].port)
            expect_blocked = ()
        if socks_port is not None:
            extra.append(await _socks_listener(proxy, spec, listen_host, socks_port, netns))
        if mode == "gateway":
            keeps = [f"{li.host}:{li.port}" for li in listeners]
            # the gateway listener is shared: identify by token, or by the sandbox's own
            # addresses (the agent holds no CAP_NET_RAW to spoof another sandbox's)
            sources = await _sandbox_sources(sandbox)
            proxy.add_client(ClientSpec(cid, sandbox_policy, token=tok, sources=sources))
        cut, probe = await _cut_and_prove(
            sandbox, keeps, [f"{li.host}:{li.port}" for li in (*listeners, *extra)],
            expect_blocked, force=force, allow_privileged=allow_privileged, redirect=redirect,
        )  # fmt: skip
    except ExecutionNotReady:
        raise
    except Exception as exc:
        raise ExecutionNotReady(f"sandbox {sandbox}: {exc}") from exc
    proxy_listener = listeners[0]
    host = proxy_listener.host
    shown = f"[{host}]" if ":" in host else host
    proxy_url = f"http://{cid}:{tok}@{shown}:{proxy_listener.port}"
    urls = {
        r.text: _rewrite(r, li.host, li.port) for r, li in zip(routes, listeners[1:], strict=True)
    }
    no_proxy = ["localhost", "127.0.0.1", "::1"] if mode == "loopback" else [host]
    return Execution(
        sandbox, cid, proxy_url, agent_env(proxy_url, no_proxy), urls, tok, cut, probe,
        (*listeners, *extra),
    )  # fmt: skip


async def _listeners(
    proxy: EgressProxy, spec: ClientSpec, routes: Sequence[FrameworkRoute], host: str,
    proxy_port: int, netns: str | None,
) -> list[Listener]:  # fmt: skip
    """The proxy listener then one forwarder per route; reused when already open."""
    existing = [li for li in proxy.listeners if li.netns == netns and li.host == host]
    by_port = {li.port: li for li in existing}
    out: list[Listener] = []
    main = by_port.get(proxy_port)
    if main is None or main.forward_to is not None:
        main = await proxy.add_listener(f"{_hp(host)}:{proxy_port}", netns=netns,
                                        client=spec if netns else None)  # fmt: skip
    out.append(main)
    used = {main.port}
    for route in routes:
        found = next((li for li in existing if li.forward_to == (route.host, route.port)), None)
        if found is None:
            port = route.port if route.port not in used and route.port not in by_port else 0
            found = await proxy.add_forwarder(f"{_hp(host)}:{port}", route.text, netns=netns,
                                              client_id=spec.client_id)  # fmt: skip
        used.add(found.port)
        out.append(found)
    return out


async def _transparent_listeners(
    proxy: EgressProxy, spec: ClientSpec, sandbox: str, port: int, dns_port: int
) -> list[Listener]:
    """The transparent listener and the DNS responder on the sandbox's 127.0.0.1, sharing
    one fake-IP map; reused when already open."""
    from .dnsanswer import FakeIPs
    from .dnsserve import open_dns

    mine = [li for li in proxy.listeners if li.netns == sandbox and li.host == "127.0.0.1"]
    listener = next((li for li in mine if li.kind == "transparent"), None)
    dns = next((li for li in mine if li.kind == "dns"), None)
    if listener is None or dns is None:
        fake_ips = FakeIPs()
        listener = await proxy.add_listener(f"127.0.0.1:{port}", netns=sandbox, client=spec,
                                            kind="transparent")  # fmt: skip
        listener.fake_ips = fake_ips
        assert listener.identity is not None
        dns = await open_dns(proxy, f"127.0.0.1:{dns_port}", identity=listener.identity,
                             fake_ips=fake_ips, netns=sandbox)  # fmt: skip
    return [listener, dns]


async def _socks_listener(
    proxy: EgressProxy, spec: ClientSpec, host: str, port: int, netns: str | None
) -> Listener:
    found = next((li for li in proxy.listeners if li.netns == netns and li.host == host
                  and li.kind == "socks5" and li.port == port), None)  # fmt: skip
    if found is not None:
        return found
    return await proxy.add_listener(f"{_hp(host)}:{port}", netns=netns,
                                    client=spec if netns else None, kind="socks5")  # fmt: skip


def _hp(host: str) -> str:
    return f"[{host}]" if ":" in host else host


async def _cut_and_prove(
    sandbox: str, keeps: Sequence[str], reachable: Sequence[str], blocked: Iterable[str], *,
    force: bool, allow_privileged: bool, redirect: tuple[int, int] | None = None,
) -> tuple[Any, Any]:  # fmt: skip
    import netcut
    from netcut.redirect import Redirect

    try:
        cut = await netcut.cut_async(
            sandbox, keeps, probe=False, force=force, allow_privileged=allow_privileged,
            redirect=Redirect(*redirect) if redirect is not None else None,
        )
        probe = await netcut.probe_async(sandbox, reachable, list(blocked))
        status = await netcut.status_async(sandbox)
    except netcut.NetcutError as exc:
        raise ExecutionNotReady(f"sandbox {sandbox}: {exc}") from exc
    if not probe.ok:
        raise ExecutionNotReady(f"sandbox {sandbox}: probe failed: {probe.reason()}")
    if not _is_cut(status):
        raise ExecutionNotReady(f"sandbox {sandbox}: status after the cut is {status}")
    return cut, probe


def _is_cut(status: Any) -> bool:
    return bool(getattr(status, "is_cut", False))


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


async def _sandbox_sources(sandbox: str) -> tuple[Network, ...]:
    """The sandbox's own non-loopback addresses, as /32 (/128) source networks."""
    import asyncio

    from .hostaddrs import local_addresses
    from .netns import run_in_netns

    found = await asyncio.to_thread(run_in_netns, sandbox, local_addresses)
    return tuple(
        ipaddress.ip_network(a)
        for a in sorted(found, key=str)
        if not (a.is_loopback or a.is_link_local or a.is_unspecified)
    )


async def _gateway_of(sandbox: str) -> str:
    """The IPv4 gateway of the sandbox's default route (the host as the sandbox sees it)."""
    import asyncio

    from .netns import run_in_netns

    def read() -> str | None:
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            for route in ipr.get_default_routes(family=2):
                gw = route.get_attr("RTA_GATEWAY")
                if gw:
                    return str(gw)
        return None

    gw = await asyncio.to_thread(run_in_netns, sandbox, read)
    if gw is None:
        raise ExecutionNotReady(f"sandbox {sandbox}: no IPv4 default route to find the host by")
    ipaddress.ip_address(gw)
    return gw


async def release_execution(
    proxy: EgressProxy, execution: Execution, *, restore: bool = False
) -> None:
    """Close the sandbox's listeners (and, with `restore`, undo the cut)."""
    for listener in execution.listeners:
        if listener in proxy.listeners:
            proxy.listeners.remove(listener)
            listener.close()
    if restore:
        import netcut

        with contextlib.suppress(netcut.NetcutError):
            await netcut.restore_async(execution.sandbox)

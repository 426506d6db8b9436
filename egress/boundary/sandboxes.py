"""The sandboxes one proxy serves (docs/user-guide.md#sandbox-lifecycle): the per-proxy
registry, which sandbox holds which listener (shared gateway listeners reference-counted),
opening or reusing a sandbox's listeners and binding its policy to them, and releasing
everything it added, each step audited."""

from __future__ import annotations

import asyncio
import errno
import secrets
import socket
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from netcut.targetref import parse_target

from ..config import ClientSpec
from ..policy.rules import FrameworkRoute, Policy
from ..policy.target import bracket, join_host_port
from ..proxy.core.clients import Identity, Leases
from ..proxy.net.listener import ListenerKind, parse_listen
from ..proxy.server import EgressProxy, Listener
from .checks import Preparation
from .execution import ExecutionNotReady, Sandbox, client_id_of
from .gateway import (
    container_network,
    gateway_of,
    inspected_gateway,
    inspected_sources,
    sandbox_sources,
)
from .passing import Role, Supply


@dataclass(frozen=True)
class Tenant:
    """Who a sandbox is to the proxy: its client id, token and policy (framework routes
    added)."""

    client_id: str
    token: str
    policy: Policy


def with_routes(policy: Policy, routes: Sequence[FrameworkRoute]) -> Policy:
    """`policy` with the sandbox's framework routes added."""
    return Policy(
        allow=policy.allow_rules,
        block=policy.block_rules,
        default=policy.default,
        framework_routes=[*policy.framework_routes, *routes],
        report_only=policy.report_only,
        resolve_names_for_address_rules=policy.resolve_names_for_address_rules,
    )


@dataclass(eq=False)
class _Registry:
    """The sandboxes one proxy serves, and which of them holds which listener."""

    sandboxes: dict[str, Sandbox] = field(default_factory=dict)
    leases: Leases[Listener] = field(default_factory=Leases)


_REGISTRIES: weakref.WeakKeyDictionary[EgressProxy, _Registry] = weakref.WeakKeyDictionary()


class Sandboxes:
    """The sandboxes `proxy` serves: each one's listeners, forwarders and client, added,
    replaced and released as one, each step audited. Made afresh for every call; what it
    holds lives in a per-proxy registry that goes with the proxy."""

    def __init__(self, proxy: EgressProxy) -> None:
        self.proxy = proxy
        reg = _REGISTRIES.get(proxy)
        if reg is None:
            reg = _REGISTRIES[proxy] = _Registry()
        self.leases = reg.leases
        self.held = reg.sandboxes
        # helper mode: the sockets a helper opened in the sandbox's namespace (passing.py)
        self.supply: Supply | None = None

    async def _adopt(self, role: Role, listener: Listener) -> Listener | None:
        """Serve `listener` on the socket the helper passed for `role`; None when it passed
        none (the listener is then opened here, as without a helper)."""
        sock = self.supply.take(role) if self.supply is not None else None
        if sock is None:
            return None
        try:
            return await self.proxy.endpoints.open(listener, sock)
        except BaseException:
            sock.close()
            raise

    async def _listen(
        self,
        listen: str,
        netns: str | None,
        role: Role,
        *,
        kind: ListenerKind = "http",
        client: ClientSpec | None = None,
    ) -> Listener:
        """`proxy.add_listener`, on the helper's socket for `role` when it passed one."""
        host, port = parse_listen(listen)
        identity = Identity(client.client_id, client.policy) if client is not None else None
        adopted = await self._adopt(role, Listener(host, port, netns, identity, kind=kind))
        if adopted is None:
            return await self.proxy.add_listener(listen, netns=netns, client=client, kind=kind)
        if client is not None:
            self.proxy.tenants.policy_applied(client.client_id, client.policy, "listener")
        return adopted

    def get(self, sandbox: str) -> Sandbox | None:
        return self.held.get(sandbox)

    async def open_extras(
        self,
        box: Sandbox,
        transparent: tuple[int, int] | None,
        socks_port: int | None,
    ) -> list[Listener]:
        """Transparent mode's listener and DNS responder (one fake-IP map between them) and the
        SOCKS5 listener, on the sandbox's loopback (or the gateway listener's address for SOCKS5
        in gateway mode); reused from a previous prepare, bound to the sandbox's current policy,
        and the ones no longer asked for released."""
        from ..proxy.codec.dns import FakeIPs
        from ..proxy.modes.dns import open_dns

        assert box.main is not None
        loopback = box.mode == "loopback"
        netns = box.main.netns if loopback else None
        held = {li.kind: li for li in self.leases.held(box.key) if li.kind != "http"}
        identity = box.main.identity  # loopback: the sandbox's; gateway: None (token or source)
        out: list[Listener] = []
        if transparent is not None:
            listener, dns = held.get("transparent"), held.get("dns")
            if listener is None or dns is None:
                assert identity is not None
                fake_ips = FakeIPs()
                listener = await self._listen(
                    f"127.0.0.1:{transparent[0]}",
                    netns,
                    ("transparent",),
                    kind="transparent",
                    client=ClientSpec(box.client_id, identity.policy),
                )
                listener.fake_ips = fake_ips
                self.leases.hold(box.key, listener)
                dns = await open_dns(
                    self.proxy,
                    f"127.0.0.1:{transparent[1]}",
                    identity=identity,
                    fake_ips=fake_ips,
                    netns=netns,
                    sockets=self._dns_sockets(),
                )
                self.leases.hold(box.key, dns)
            out += [listener, dns]
        if socks_port is not None:
            socks = held.get("socks5")
            if socks is None or socks.port not in (0, socks_port):
                socks = await self._listen(
                    join_host_port(box.main.host, socks_port), netns, ("socks",), kind="socks5"
                )
                self.leases.hold(box.key, socks)
            out.append(socks)
        for li in out:
            li.identity = identity
        for old in held.values():
            if old not in out and self.leases.let_go(box.key, old):
                self.proxy.remove_listener(old)
        return out

    def _dns_sockets(self) -> tuple[socket.socket, socket.socket] | None:
        """The DNS responder's TCP and UDP sockets, when the helper passed them."""
        if self.supply is None:
            return None
        tcp, udp = self.supply.take(("dns",)), self.supply.take(("dns",))
        if tcp is None or udp is None:
            for sock in (tcp, udp):
                if sock is not None:
                    sock.close()
            return None
        return tcp, udp

    def admit(self, ask: Preparation, prior: Sandbox | None) -> Tenant:
        """Who the sandbox will be (its client id and token kept from a previous prepare
        unless new ones are given), refused before anything is opened, so a refusal changes
        nothing: a client id belongs to one sandbox (or one configured client), a sandbox
        keeps its mode, and a gateway sandbox its keeps."""
        cid = ask.client_id or (prior.client_id if prior else client_id_of(ask.sandbox))
        tok = ask.token or (prior.token if prior else secrets.token_urlsafe(24))
        self._refuse_taken(ask, cid, prior)
        self._refuse_new_keeps(ask, prior)
        return Tenant(cid, tok, with_routes(ask.policy, ask.routes))

    def _refuse_taken(self, ask: Preparation, cid: str, prior: Sandbox | None) -> None:
        sandbox = ask.sandbox
        for other in self.held.values():
            if other.client_id == cid and other.key != sandbox:
                raise ExecutionNotReady(
                    f"sandbox {sandbox}: client id {cid!r} is already used by sandbox {other.key}",
                    "client_id_taken",
                )
        owned = prior is not None and prior.client_id == cid
        if ask.mode == "gateway" and not owned and self.proxy.clients.spec(cid) is not None:
            raise ExecutionNotReady(
                f"sandbox {sandbox}: client id {cid!r} is a configured client", "client_id_taken"
            )
        if prior is not None and prior.mode != ask.mode:
            raise ExecutionNotReady(
                f"sandbox {sandbox}: already prepared in {prior.mode} mode; release it first",
                "already_prepared",
            )

    @staticmethod
    def _refuse_new_keeps(ask: Preparation, prior: Sandbox | None) -> None:
        """In gateway mode the cut keeps the listeners' ports, and a cut namespace is never
        re-cut with other keeps (that would open it in between): a second prepare may change
        the policy, not the routes or the port (docs/user-guide.md#sandbox-lifecycle)."""
        if prior is None or prior.mode != "gateway":
            return
        if set(prior.forwarders) != {(r.host, r.port) for r in ask.routes} or (
            ask.proxy_port != prior.proxy_port
        ):
            raise ExecutionNotReady(
                f"sandbox {ask.sandbox}: a gateway sandbox keeps its framework routes and proxy "
                "port; release it with restore=True first",
                "already_prepared",
            )

    async def bind(self, ask: Preparation, tenant: Tenant, prior: Sandbox | None) -> Sandbox:
        """Open (or reuse) the sandbox's listeners and bind its policy to them in one step.
        In helper mode the gateway and the sandbox's addresses come from its runtime's
        `inspect`, never from inside the namespace (docs/user-guide.md#helper-mode)."""
        sandbox, cid = ask.sandbox, tenant.client_id
        # only gateway mode needs the runtime's view (its gateway, the sandbox's sources): in
        # loopback mode the helper's run already knows the namespace, and an `inspect` more
        # costs a client start and an engine round trip (docs/benchmarks.md)
        helper_gateway = ask.cut_mode == "helper" and ask.mode == "gateway"
        net = await container_network(sandbox) if helper_gateway else None
        host, netns = await self._where(ask, prior, net)
        main = prior.main if prior else None
        box = Sandbox(sandbox, cid, ask.mode, tenant.token, ask.proxy_port, main, {})
        if prior is None:
            self.held[sandbox] = box
        box.main = await self._main_listener(box, host, netns, prior)
        box.forwarders = await self._forwarders(box, ask.routes, host, netns, prior)
        # the policy switch: one assignment (loopback) or one table swap (gateway)
        if ask.mode == "loopback":
            box.main.identity = Identity(cid, tenant.policy)
            self.proxy.tenants.policy_applied(
                cid, tenant.policy, "sandbox"
            )  # policy.md#policy-hash
        else:
            sources = inspected_sources(net) if net else await sandbox_sources(sandbox)
            self.proxy.add_client(
                ClientSpec(cid, tenant.policy, token=tenant.token, sources=sources)
            )
        self.held[sandbox] = box
        # transparent mode's and SOCKS5 listeners are open_extras' to keep or let go
        extras = {li for li in self.leases.held(sandbox) if li.kind != "http"}
        used = {box.main, *box.forwarders.values(), *extras}
        for old in self.leases.held(sandbox):
            if old not in used and self.leases.let_go(sandbox, old):
                self.proxy.remove_listener(old)
        return box

    async def _where(
        self, ask: Preparation, prior: Sandbox | None, net: Any
    ) -> tuple[str, str | None]:
        """The host address the sandbox's listeners open on, and the namespace they open in
        (None: the proxy's own)."""
        if ask.mode == "loopback":
            if self.supply is not None:  # the helper knows it: no runtime to ask
                return "127.0.0.1", self.supply.netns
            return "127.0.0.1", await self._namespace_file(ask.sandbox)
        # once cut, the sandbox has no default route left to find the host by: keep the first
        known = prior.main.host if prior and prior.main else None
        found = ask.gateway or known
        if found is None:
            found = inspected_gateway(ask.sandbox, net) if net else await gateway_of(ask.sandbox)
        return found, None

    @staticmethod
    async def _namespace_file(sandbox: str) -> str:
        """Where the sandbox's listeners open: the sandbox itself when naming its namespace file
        costs nothing (a name, a PID, a path); a container's /proc/PID/ns/net, asked of its
        runtime off the event loop (`docker inspect` takes ~0.1 s, `podman info` ~0.7 s)."""
        if parse_target(sandbox).kind != "container":
            return sandbox
        from ..proxy.net.netns import namespace_path

        return await asyncio.to_thread(namespace_path, sandbox)

    async def _main_listener(
        self,
        box: Sandbox,
        host: str,
        netns: str | None,
        prior: Sandbox | None,
    ) -> Listener:
        """The sandbox's proxy listener: its own (loopback) or a shared one (gateway)."""
        port = box.proxy_port
        if prior and prior.main and prior.proxy_port == port and prior.main.host == host:
            return prior.main
        if box.mode == "gateway":
            for li in self.proxy.listeners:
                if li.netns is None and li.host == host and li.forward_to is None:
                    ours = bool(self.leases.holders(li))
                    if ours and port in (0, li.port):
                        self.leases.hold(box.key, li)
                        return li
                    if not ours and li.identity is None and li.port == port:
                        return li  # the proxy's own listener: shared, never closed by a release
        li = await self._listen(f"{bracket(host)}:{port}", netns, ("main",))
        self.leases.hold(box.key, li)
        return li

    async def _forwarders(
        self,
        box: Sandbox,
        routes: Sequence[FrameworkRoute],
        host: str,
        netns: str | None,
        prior: Sandbox | None,
    ) -> dict[tuple[str, int], Listener]:
        """One forwarder per route, reused from this sandbox (or, on a gateway, any sandbox)."""
        out: dict[tuple[str, int], Listener] = {}
        mine = dict(prior.forwarders) if prior else {}
        used = {li.port for li in self.proxy.listeners if li.netns == netns and li.host == host}
        for route in routes:
            key = (route.host, route.port)
            found = mine.get(key)
            if found is None and box.mode == "gateway":
                found = next(
                    (
                        li
                        for li in self.proxy.listeners
                        if li.netns is None
                        and li.host == host
                        and li.forward_to == key
                        and self.leases.holders(li)
                    ),
                    None,
                )
            if found is None or found not in self.proxy.listeners:
                cid = box.client_id if box.mode == "loopback" else None  # a shared one is nobody's
                found = await self._open_forwarder(route, host, netns, cid, used)
            self.leases.hold(box.key, found)
            used.add(found.port)
            out[key] = found
        return out

    async def _open_forwarder(
        self,
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
        tell (EADDRINUSE). The `Execution`'s `framework_urls` name the port chosen. A helper
        made that choice itself when it opened the socket (passing.py)."""
        dest = (route.host, route.port)
        identity = Identity(cid, Policy(framework_routes=[route]))
        passed = Listener(host, route.port, netns, identity, dest)
        adopted = await self._adopt(("forward", *dest), passed)
        if adopted is not None:
            return adopted
        if route.port not in used:
            try:
                return await self.proxy.add_forwarder(
                    f"{bracket(host)}:{route.port}", route.text, netns=netns, client_id=cid
                )
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
        return await self.proxy.add_forwarder(
            f"{bracket(host)}:0", route.text, netns=netns, client_id=cid
        )

    def release(self, sandbox: str, *, why: str) -> bool:
        """Remove everything `sandbox` added: its client (token, sources), and every listener and
        forwarder no other sandbox holds. Idempotent; False if it was not prepared."""
        box = self.held.pop(sandbox, None)
        for listener in self.leases.drop(sandbox):
            self.proxy.remove_listener(listener)
        if box is None:
            return False
        if box.mode == "gateway":
            self.proxy.remove_client(box.client_id)
        elif box.main is not None:
            box.main.identity = None  # a connection still open on it is nobody's any more
        self.audit(sandbox, box.client_id, "sandbox_removed", why)
        return True

    def audit(self, sandbox: str, cid: str, reason: str, detail: str) -> None:
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
        if self.proxy.audit is not None:
            self.proxy.audit.record(event)
        for hook in self.proxy.hooks:
            hook(event)

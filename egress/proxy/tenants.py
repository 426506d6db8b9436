"""`ClientControl`: the clients and live-policy half of `EgressProxy`'s public API.

Shell. Adding, replacing and removing clients, swapping one client's policy or the whole
configuration while connections are served (docs/policy.md#live-policy-changes), reserving
a network in the address guard, re-reading the host's own addresses, and auditing each
policy as it starts to apply (docs/audit-log.md). A component of `EgressProxy`
(`server.py`): the state it works on (`settings`, `gate`, `resolver`, `listeners`, the open
connections) is the proxy's `ProxyContext` (`context.py`), shared with the accept path, and
it is handed nothing else. Its public methods are the bodies of `EgressProxy`'s of the same
name, which document them (once, where users read).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from ..config import ClientSpec, Settings
from ..policy.addrs import AddressGuard, parse_cidr
from ..policy.rules import Policy
from ..policy.target import IPAddress, IPNetwork, join_host_port, parse_ip_literal
from ..reasons import End
from .context import ProxyContext
from .core.clients import ClientTable, Identity
from .core.record import AccessRecord, perf_counter_ns
from .core.revocation import revoked_by
from .net.hostaddrs import local_addresses_async
from .net.resolve import Resolver


class ClientControl:
    """Who the proxy serves and under which policy, a component of `EgressProxy`."""

    def __init__(
        self,
        context: ProxyContext,
        *,
        own_resolver: bool,
        host_local: frozenset[IPAddress] | None,
        listen_netns: str | None,
    ) -> None:
        self.context = context
        self.own_resolver = own_resolver  # the caller's: a reload keeps it
        self.host_local = host_local  # fixed by the caller, else read from the interfaces
        self.listen_netns = listen_netns

    # networks reserved by the proxy itself (a transparent sandbox's fake-IP pool): they
    # belong to the sandboxes, not to the configuration, so a reload keeps them
    _owned_reserves: tuple[IPNetwork, ...] = ()

    @property
    def clients(self) -> ClientTable:
        return self.context.gate.clients

    @property
    def guard(self) -> AddressGuard:
        return self.context.gate.guard

    def add_client(self, spec: ClientSpec) -> Identity:
        identity = self.clients.put(spec)
        self.sync_settings()
        self.policy_applied(spec.client_id, spec.policy, "api")
        return identity

    def remove_client(self, client_id: str) -> ClientSpec | None:
        spec = self.clients.remove(client_id)
        self.sync_settings()
        return spec

    def sync_settings(self) -> None:
        s = self.context.settings
        specs = tuple(self.clients.spec(c) for c in self.clients.client_ids)
        self.context.settings = Settings(s.policy, s.guard, s.resolve, specs)  # type: ignore[arg-type]

    # --- live policy (docs/policy.md#live-policy-changes) -----------------------------------
    def set_client_policy(self, client_id: str, policy: Policy, *, source: str = "api") -> None:
        known = self.clients.spec(client_id) is not None
        bound = [
            li
            for li in self.context.listeners
            if li.identity is not None
            and li.identity.client_id == client_id
            and li.forward_to is None
        ]
        if not known and not bound:
            raise KeyError(f"no client {client_id!r} on this proxy")
        if known:
            self.clients.replace(client_id, policy)
            self.sync_settings()
        for listener in bound:
            listener.identity = Identity(client_id, policy)
        self.policy_applied(client_id, policy, source)
        self.revoke_tunnels({client_id: policy})

    async def replace_settings(self, settings: Settings, *, source: str = "api") -> None:
        guard = settings.guard
        kept = tuple(n for n in self._owned_reserves if n not in guard.extra)
        if kept:
            settings = replace(settings, guard=replace(guard, extra=(*guard.extra, *kept)))
        context = self.context
        context.settings = settings
        context.gate.clients = ClientTable(settings, require_auth=self.clients.require_auth)
        if not self.own_resolver:
            old, context.resolver = context.resolver, Resolver(settings.resolve)
            if context.steps is not None:
                context.steps.resolver = context.resolver
            old.close()
        by_id = {c.client_id: c.policy for c in settings.clients}
        for listener in context.listeners:
            ident = listener.identity
            if ident is not None and listener.forward_to is None and ident.client_id in by_id:
                listener.identity = Identity(ident.client_id, by_id[ident.client_id])
        await self.refresh_host_local()  # the guard from the new settings
        self.policy_applied(None, settings.policy, source)
        for spec in settings.clients:
            self.policy_applied(spec.client_id, spec.policy, source)
        policies: dict[str | None, Policy] = {None: settings.policy}
        policies.update(by_id)
        self.revoke_tunnels(policies)

    def revoke_tunnels(self, policies: Mapping[str | None, Policy]) -> int:
        context = self.context
        guard = context.gate.guard
        closed = 0
        # the last request of an idle connection -> (listener, its mode): one record each
        idle: dict[AccessRecord, tuple[str | None, str | None]] = {}
        for conn in list(context.conns):
            rec = conn.relaying
            if conn.end is not None:
                continue
            if rec is None and conn.phase in ("active", "hello"):
                # being judged, resolved or dialed under the old policy: judged again by
                # the new one before it relays (drive/executor.py)
                conn.policies_changed(policies)
                continue
            if not isinstance(rec, AccessRecord):
                continue
            if revoked_by(policies, guard, rec) is None:
                continue
            conn.cut_by(End.REVOKED)
            closed += 1
            between = conn.phase in ("idle", "head") and rec.scheme == "http"
            if not between:
                conn.side.abort()
                if conn.upstream is not None:
                    conn.upstream.abort()
                continue
            conn.side.close()
            listener = conn.listener
            kind: str = "forward" if listener.forward_to is not None else listener.kind
            idle[rec] = (join_host_port(listener.host, listener.port), kind)
        if context.pool is not None:
            for side in context.pool.revoke(
                lambda s: revoked_by(policies, guard, s.last_rec) is not None
            ):
                closed += 1
                if isinstance(side.last_rec, AccessRecord):
                    idle.setdefault(side.last_rec, (None, None))
        for last_rec, (listener_at, mode) in idle.items():
            self._record_revoked(last_rec, policies, listener_at, mode)
        return closed

    def _record_revoked(
        self,
        last_rec: AccessRecord,
        policies: Mapping[str | None, Policy],
        listener: str | None,
        kind: str | None,
    ) -> None:
        """The connection record of what was closed between requests (docs/audit-log.md)."""
        policy = policies[last_rec.client_id]
        verdict = revoked_by(policies, self.context.gate.guard, last_rec)
        assert verdict is not None
        what = "a kept-alive connection" if listener is not None else "a pooled upstream"
        rec = AccessRecord.revoked(
            last_rec, perf_counter_ns(), (listener, kind), what, policy.digest
        )
        assert self.context.steps is not None  # a record to write: the proxy is running
        self.context.steps.emit(rec, "block", verdict.reason, verdict.rule, rec.detail, None)

    def policy_applied(self, client_id: str | None, policy: Policy, source: str) -> None:
        """Audit that `policy` starts applying to `client_id` (docs/audit-log.md)."""
        audit = self.context.audit
        if audit is None or not self.context.started:
            return
        audit.record(
            {
                "type": "policy",
                "client_id": client_id,
                "policy": policy.digest,
                "source": source,
                "canonical": policy.canonical(),
            }
        )

    # --- the address guard ------------------------------------------------------------------
    def reserve(self, network: str) -> None:
        net = parse_cidr(network)
        if net not in self._owned_reserves:
            self._owned_reserves = (*self._owned_reserves, net)
        context = self.context
        guard = context.settings.guard
        if net in guard.extra:
            return
        context.settings = replace(
            context.settings, guard=replace(guard, extra=(*guard.extra, net))
        )
        context.gate.set_guard(replace(context.gate.guard, extra=context.settings.guard.extra))

    async def refresh_host_local(self) -> None:
        if self.host_local is not None:
            found = self.host_local
        else:
            found = await local_addresses_async()
        context = self.context
        own = {parse_ip_literal(h) for h, _ in context.addresses if not self.listen_netns}
        extra = frozenset(a for a in own if a is not None and not a.is_unspecified)
        context.gate.set_guard(context.settings.guard.with_host_local(found | extra))


__all__ = ["ClientControl"]

"""`Kept`: the decision a kept-alive connection remembers for its next request.

Pure. Every request is judged, and a verdict is a pure function of who asks (the listener's
bound client, else the client table and the request's credential), their policy, the
address guard, the destination (its authority) and, for a name, the resolver's answer. So
when the next request on the same connection has all of those unchanged, the last
request's verdict and its checked addresses are the verdict this one would get, and the
callback fast path takes them from here instead of asking the gate again
(docs/architecture.md#the-kept-decision): no identification by token or source (a scan over
the sandboxes), no policy judge, no guard re-check.

What is compared is object identity where the proxy swaps an object on a change (a new
`Identity` on a policy change, a new `ClientTable` on a reload, a new guard on
`reserve`/`set_guard`, a new resolver answer), and `ClientTable.generation`, bumped by
every add, replace and remove of a client (a sandbox's prepare and release). Anything else
misses, and the request is judged afresh.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Protocol

from .actions import Dial
from .sequence import State

if TYPE_CHECKING:
    from ...policy.addrs import AddressGuard
    from ...policy.rules import Decision
    from ...policy.target import IPAddress, Target
    from .clients import ClientTable, Identity
    from .gate import Admit
    from .intent import Front
    from .record import AccessRecord

# `Kept.credential` when the request's credential decides nothing (a listener-bound client,
# or no per-client policy at all): never compared
ANY_CREDENTIAL: Final = object()


class Reached(Protocol):
    """What `Kept.reached` reads of an exchange (`core/exchange.Exchange`, which imports this
    module for `start_kept`: a protocol, not an import back)."""

    state: State
    front: Front
    record: AccessRecord
    identity: Identity | None
    target: Target | None
    first: Decision | None
    admitted: Admit | None
    dialed_addr: IPAddress | None


class Kept:
    """One connection's last decision: its key (what it depends on) and its verdict."""

    __slots__ = (
        "admitted",
        "authority",
        "bound",
        "clients",
        "credential",
        "detail",
        "dial",
        "explicit_port",
        "first",
        "front",
        "generation",
        "guard",
        "identity",
        "owner",
        "policy",
        "reason",
        "resolved",
        "rule",
        "target",
        "would",
    )

    def __init__(
        self,
        *,
        authority: str,
        bound: Identity | None,
        clients: ClientTable,
        credential: object,
        guard: AddressGuard,
        owner: object,
        resolved: tuple[IPAddress, ...] | None,
        front: Front,
        identity: Identity,
        target: Target,
        explicit_port: bool,
        first: Decision,
        admitted: Admit,
        dial: Dial,
        reason: str | None,
        rule: str | None,
        would: str | None,
        detail: str | None,
    ) -> None:
        # the key
        self.authority = authority  # the request target's, as `split_url` cut it
        self.bound = bound  # the listener's client then (compared by identity)
        self.clients = clients
        self.generation = clients.generation
        self.credential = credential  # Proxy-Authorization then, or ANY_CREDENTIAL
        self.guard = guard
        self.owner = owner  # whose slots the connection counts in (its cap was passed)
        self.resolved = resolved  # the resolver's answer for a name (None: an IP literal)
        # the verdict, as the exchange reached it, and the record fields it wrote
        self.front = front
        self.identity = identity
        self.policy = identity.policy.digest
        self.target = target
        self.explicit_port = explicit_port
        self.first = first
        self.admitted = admitted
        self.dial = dial  # every checked address, pooled
        self.reason = reason
        self.rule = rule
        self.would = would
        self.detail = detail

    @classmethod
    def reached(
        cls,
        x: Reached,
        *,
        authority: str,
        bound: Identity | None,
        clients: ClientTable,
        credential: object,
        guard: AddressGuard,
        owner: object,
        resolved: tuple[IPAddress, ...] | None,
        explicit_port: bool,
    ) -> Kept | None:
        """The decision exchange `x` reached, kept for the connection's next request under
        the key it was reached with; None unless it was admitted and dialed on a pooled
        upstream, its head not sent yet (a request of the HTTP front-end). `resolved`: the
        resolver's answer it was judged on, for a name."""
        identity, target, first, admitted = x.identity, x.target, x.first, x.admitted
        if (
            x.state is not State.SENDING
            or x.front.shape != "request"
            or identity is None
            or target is None
            or first is None
            or admitted is None
            or x.dialed_addr is None
        ):
            return None
        addrs = (target.ip,) if target.ip is not None else resolved
        if addrs is None:
            return None
        rec = x.record
        return cls(
            authority=authority,
            bound=bound,
            clients=clients,
            credential=credential,
            guard=guard,
            owner=owner,
            resolved=None if target.ip is not None else resolved,
            front=x.front,
            identity=identity,
            target=target,
            explicit_port=explicit_port,
            first=first,
            admitted=admitted,
            dial=Dial(addrs, target.port, pooled=True),
            reason=rec.reason,
            rule=rec.rule,
            would=rec.would,
            detail=rec.detail,
        )

    def holds(
        self,
        authority: str,
        bound: Identity | None,
        clients: ClientTable,
        guard: AddressGuard,
        owner: object,
    ) -> bool:
        """Whether a request to `authority` on the same connection, with these, would be
        decided as the last one was (the credential and the resolver's answer are the
        caller's to compare: only some requests have them)."""
        return (
            authority == self.authority
            and bound is self.bound
            and clients is self.clients
            and clients.generation == self.generation
            and guard is self.guard
            and owner == self.owner
        )


__all__ = ["ANY_CREDENTIAL", "Kept"]

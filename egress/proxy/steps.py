"""The steps every exchange shares: identify, authorize, resolve, answer, record.

Shell. `forward.py` (absolute-form HTTP) and `tunnel.py` (CONNECT, forwarders) call these
between their own I/O: each step asks the pure gate (`gate.py`) and turns a `Refuse` into a
`Refused` exception, which the exchange hands to `answer`, the one place that writes an
error response and its audit record (docs/architecture.md#one-request).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from ..policy.rules import Policy
from ..policy.target import IPAddress, Target, join_host_port
from ..reasons import End, Reason
from . import wire
from .admission import Admitted, Budget, Owner, Slots
from .clients import Identity
from .conn import Conn, Limits, idle_of
from .fairshare import Turns
from .gate import AUDIT_DOWN, Admit, Gate, Refuse, Refused, refuse_resolve
from .metrics import BATCH, ProxyMetrics
from .pool import UpstreamPool
from .record import AccessRecord, perf_counter_ns, seconds_since
from .resolve import ResolveError, Resolver
from .responses import error_response
from .tally import Tally

CACHE_MAX = 65536
# how a connection the proxy closed before any exchange is recorded (docs/audit-log.md)
_CLOSED: dict[str, tuple[Reason, str]] = {
    End.HEAD_TIMEOUT.value: (
        Reason.HEAD_TIMEOUT,
        "closed: nothing received within the head timeout",
    ),
    End.HELLO_TIMEOUT.value: (
        Reason.HEAD_TIMEOUT,
        "closed: handshake not completed within the head timeout",
    ),
    End.IDENTIFY_TIMEOUT.value: (
        Reason.IDENTIFY_TIMEOUT,
        "closed: no request named its client within identify_timeout",
    ),
    End.EVICTED.value: (
        Reason.EVICTED,
        "closed unidentified: its source's budget of unidentified connections was full",
    ),
}
# a connection record as the refusal tally keeps it: (record, reason, detail, status)
_Pending = tuple[AccessRecord, str, str, int | None]


class AuditSink(Protocol):
    """What the proxy needs of an audit log (`egress.audit.AuditLog` is one)."""

    @property
    def accepting(self) -> bool: ...

    def record(self, event: dict[str, object]) -> None: ...


@runtime_checkable
class LifecycleSink(AuditSink, Protocol):
    """A sink that also takes open and progress records (`egress.audit.AuditLog` does); a
    plain `AuditSink` gets request records only (docs/audit-log.md#open-and-progress)."""

    @property
    def interim_interval(self) -> float: ...

    def opened(self, event: dict[str, object]) -> int: ...


class Steps:
    """The shared steps of one running proxy (built by `EgressProxy.start`)."""

    __slots__ = (
        "_addr_texts",
        "_refusals",
        "audit",
        "closing",
        "fast_path",
        "gate",
        "hooks",
        "lifecycle",
        "limits",
        "loop",
        "metrics",
        "observe",
        "pool",
        "resolver",
        "slots",
        "turns",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        gate: Gate,
        pool: UpstreamPool,
        resolver: Resolver,
        audit: AuditSink | None,
        limits: Limits,
        hooks: list[Callable[[dict[str, object]], object]],
        observe: Callable[[dict[str, object]], None] = lambda _: None,
        metrics: ProxyMetrics | None = None,
    ) -> None:
        self.loop = loop
        self.gate = gate
        self.pool = pool
        self.resolver = resolver
        self.audit = audit
        # open/progress records go to a sink that takes them (`LifecycleSink`)
        self.lifecycle = audit if isinstance(audit, LifecycleSink) else None
        self.limits = limits
        self.hooks = hooks
        # docs/metrics.md: metrics, summaries and callbacks get each record the audit log gets
        self.observe = observe
        self.metrics = metrics
        self.closing = False
        # serve kept-alive requests from callbacks where possible (`fast.py`); off = every
        # request takes the coroutine path (tests compare the two)
        self.fast_path = True
        # who holds which connection, from accept (admission.py, docs/proxy.md#limits)
        self.slots: Slots[Conn] = Slots(
            Budget(
                limits.max_connections,
                limits.client_cap,
                limits.unidentified_per_source,
                limits.unidentified_total,
            )
        )
        self._refusals: Tally[_Pending] = Tally()
        # requests in flight per client (fairshare.py, docs/proxy.md#fair-share)
        self.turns = Turns(loop, limits.max_client_inflight)
        self._addr_texts: dict[IPAddress, str] = {}

    # --- admission: a connection belongs to a client from accept (admission.py) --------------
    def admit(self, conn: Conn) -> Refuse | None:
        """Count a new connection: in its client's cap when the listener (or its source
        address) names the client, else in its source's unidentified budget. Closes what
        must make room (an unidentified connection, or the client's own idle one)."""
        peer = conn.peer
        source = peer[0] if isinstance(peer, tuple) and peer else conn.client
        owner: Owner | None = None
        ident = self.gate.clients.identity_at_accept(conn.listener.identity, str(source))
        if ident is not None:
            owner = ident.client_id if ident.client_id is not None else ("source", source)
        slots = self.slots
        reclaim = None
        if owner is not None and slots.total >= self.limits.max_connections:
            reclaim = idle_of(slots.members(owner))
        verdict = slots.admit(conn, owner, str(source), self.loop.time(),
                              reclaimable=reclaim is not None)  # fmt: skip
        if isinstance(verdict, Refuse):
            conn.owner = owner
            return verdict
        conn.owner = owner
        if reclaim is not None and slots.total > self.limits.max_connections:
            reclaim.side.close()  # its own kept-alive connection, between requests
        self._evict(verdict)
        return None

    def _evict(self, verdict: Admitted[Conn]) -> None:
        for victim in verdict.evicted:
            victim.end = End.EVICTED.value
            victim.side.close()

    def overdue(self, now: float) -> None:
        """Close connections still unidentified after `identify_timeout` (the sweeper)."""
        for conn in self.slots.overdue(now, self.limits.identify_timeout):
            if conn.phase in ("head", "hello", "idle") and conn.end is None:
                conn.end = End.IDENTIFY_TIMEOUT.value
                conn.side.close()

    def identify(self, conn: Conn, head: wire.RequestHead, rec: AccessRecord) -> Identity:
        """The request's client (`gate.identify`), counted against its per-client cap."""
        return self._counted(conn, self.gate.identify(conn.listener.identity, conn.peer, head), rec)

    def identify_as(self, conn: Conn, authorization: str | None, rec: AccessRecord) -> Identity:
        """`identify` for a credential given as a `Basic` value (a SOCKS5 password as one)."""
        found = self.gate.identify_credential(conn.listener.identity, conn.peer, authorization)
        return self._counted(conn, found, rec)

    def _counted(self, conn: Conn, found: Identity | Refuse, rec: AccessRecord) -> Identity:
        """The identity, counted against its per-client cap; a SOCKS5 or transparent
        listener's records say so (`mode`, `orig_dst`: docs/audit-log.md)."""
        if conn.listener.kind != "http":
            rec.mode, rec.orig_dst = conn.listener.kind, conn.orig_dst
        if isinstance(found, Refuse):
            raise Refused(found)
        cid = found.client_id
        rec.identify(cid)
        rec.policy = found.policy.digest  # docs/policy.md#policy-hash
        if conn.owner != cid and (cid is not None or conn.owner is None):
            owner: Owner = cid
            if cid is None:  # the default client: shared by everyone, so per source
                peer = conn.peer
                owner = ("source", peer[0] if isinstance(peer, tuple) and peer else conn.client)
            if owner != conn.owner:
                refusal = self.slots.identify(conn, owner)
                if refusal is not None:
                    raise Refused(refusal)
                conn.owner = owner
        return found

    async def authorize(
        self, policy: Policy, target: Target, rec: AccessRecord
    ) -> tuple[Admit, tuple[IPAddress, ...]]:
        """Decide, resolve, decide on the addresses; raise `Refused` for any refusal.

        Times head-to-verdict for the metrics (docs/metrics.md)."""
        gate = self.gate
        metrics = self.metrics
        audit = self.audit
        if audit is not None and not audit.accepting:  # closed mode: docs/audit-log.md
            raise Refused(AUDIT_DOWN)
        try:
            first = gate.decide(policy, target)
            early = gate.refuse_early(first)
            if early is not None:
                raise Refused(early)
            if first.would is not None:  # kept if the lookup or the dial fails after it
                rec.admitted(first.reason, first.rule)
                rec.would, rec.detail = first.would, first.detail
            if target.ip is not None:
                addrs: tuple[IPAddress, ...] = (target.ip,)
            else:
                addrs = await self.resolve(target.host)
            verdict = gate.admit(policy, target, first, addrs)
        finally:
            if metrics is not None:  # parsed head -> verdict (docs/metrics.md)
                metrics.decision.observe(seconds_since(rec.t0))
        if isinstance(verdict, Refuse):
            raise Refused(verdict)
        _admitted(verdict, rec)
        return verdict, addrs

    def authorize_now(
        self, policy: Policy, target: Target
    ) -> tuple[Admit, tuple[IPAddress, ...]] | None:
        """`authorize`'s decisions when nothing needs waiting (the gate's cached verdicts),
        or None when the name is not in the resolver's cache or the verdict is a refusal:
        the callback fast path (`fast.py`) then leaves the request to the coroutine path,
        which decides again and answers. Records nothing: see `authorized_now`."""
        gate = self.gate
        audit = self.audit
        if audit is not None and not audit.accepting:  # the coroutine path refuses it
            return None
        first = gate.decide(policy, target)
        if gate.refuse_early(first) is not None:
            return None
        if target.ip is not None:
            addrs: tuple[IPAddress, ...] = (target.ip,)
        else:
            cached = self.resolver.cached(target.host)
            if cached is None:
                return None
            addrs = cached
        verdict = gate.admit(policy, target, first, addrs)
        if isinstance(verdict, Refuse):
            return None
        return verdict, addrs

    def authorized_now(self, verdict: Admit, target: Target, rec: AccessRecord) -> None:
        """Record an `authorize_now` verdict as `authorize` does (the record, the metrics)."""
        metrics = self.metrics
        if metrics is not None:  # docs/metrics.md
            if target.ip is None:  # a resolver cache hit: answered without a wait
                metrics.dns.observe(0.0)
            metrics.decision.observe(seconds_since(rec.t0))
        _admitted(verdict, rec)

    def check_audit(self) -> None:
        """Raise `Refused` (`audit_unavailable`) when the log cannot record what would be
        served (closed mode); `authorize` does this for every request and tunnel."""
        audit = self.audit
        if audit is not None and not audit.accepting:
            raise Refused(AUDIT_DOWN)

    def opened(self, conn: Conn, rec: AccessRecord) -> None:
        """The upstream is contacted: write the `open` record (docs/audit-log.md#open-and-
        progress) before the first byte goes to it; the end record will carry its `id`."""
        audit = self.lifecycle
        if audit is not None:
            rec.link = audit.opened(rec.opened())
            rec.reported = self.loop.time()
            conn.rec = rec

    def progress(self, conn: Conn, now: float) -> None:
        """A `progress` record for a long tunnel or exchange (the sweeper calls this every
        `interim_interval`): bytes so far, so a crash loses at most one interval."""
        rec = conn.rec
        audit = self.lifecycle
        if rec is None or not rec.link or audit is None:
            return
        if now - rec.reported < audit.interim_interval:
            return
        rec.reported = now
        upstream = conn.upstream
        audit.record(
            {
                "type": "progress",
                "id": rec.link,
                "client": rec.client,
                "bytes_up": conn.side.bytes_relayed,
                "bytes_down": upstream.bytes_relayed if upstream is not None else 0,
                "duration_ms": round((perf_counter_ns() - rec.t0) / 1e6, 3),
            }
        )

    async def resolve(self, host: str) -> tuple[IPAddress, ...]:
        metrics = self.metrics
        t0 = perf_counter_ns() if metrics is not None else 0
        try:
            return await self.resolver.resolve(host)
        except (ResolveError, TimeoutError) as exc:
            raise Refused(refuse_resolve(exc, host)) from None
        finally:
            if metrics is not None:
                metrics.dns.observe(seconds_since(t0))

    def addr_text(self, addr: IPAddress) -> str:
        text = self._addr_texts.get(addr)
        if text is None:
            if len(self._addr_texts) > CACHE_MAX:
                self._addr_texts.clear()
            text = self._addr_texts[addr] = str(addr)
        return text

    # --- answers and audit: the one place that answers refusals ------------------------------
    def refuse_now(self, conn: Conn, refusal: Refuse, *, write: bool = True) -> None:
        """Answer and audit a refusal that comes before any request was understood."""
        status, data = error_response(refusal.reason, refusal.detail, status=refusal.status)
        if write:
            conn.side.write(data)
        conn.served = True
        self._connection_record(conn, refusal.reason.value, refusal.detail, status)

    def record_closed(self, conn: Conn) -> None:
        """A connection the proxy closed before any exchange (timeouts, eviction): one
        record, so nothing a sandbox does goes unrecorded (docs/audit-log.md)."""
        if conn.served or conn.end is None:
            return
        found = _CLOSED.get(conn.end)
        if found is not None:
            reason, detail = found
            self._connection_record(conn, reason.value, detail, None, end=conn.end)

    def _connection_record(
        self, conn: Conn, reason: str, detail: str, status: int | None, end: str | None = None
    ) -> None:
        """A record naming the listener, its mode and the client when known; refusal floods
        become one record per client, listener and reason per second (`tally.py`)."""
        listener = conn.listener
        rec = AccessRecord(conn.client, "-", "", "", 0, perf_counter_ns())
        rec.listener = join_host_port(listener.host, listener.port)
        rec.mode = "forward" if listener.forward_to is not None else listener.kind
        rec.end = end
        owner = conn.owner
        if owner is not None:
            rec.identify(owner if isinstance(owner, str) else None)
        who = owner if owner is not None else _source(conn)
        key = (id(listener), who, reason)
        now = self.loop.time()
        for pending, count in self._refusals.add(key, (rec, reason, detail, status), now):
            self._write_pending(pending, count)

    def _write_pending(self, pending: _Pending, count: int) -> None:
        rec, reason, detail, status = pending
        if count > 1:
            rec.count = count
            detail = f"{detail} ({count} in one second, this the last)"
        self.emit(rec, "error", reason, None, detail, status)

    def flush_refusals(self, *, everything: bool = False) -> None:
        """Write the counted refusals whose second has ended (the sweeper; stop)."""
        for pending, count in self._refusals.due(self.loop.time(), everything=everything):
            self._write_pending(pending, count)

    def answer(self, conn: Conn, rec: AccessRecord, refusal: Refuse, close: bool = True) -> None:
        """Write the refusal (unless the tunnel is already open) and audit it."""
        status: int | None
        if rec.status == 200 and rec.method == "CONNECT":
            status = 200  # refused after the tunnel opened (SNI): close, nothing to say
        else:
            status, data = error_response(
                refusal.reason, refusal.detail, status=refusal.status, close=close
            )
            conn.side.write(data)
        rec.finish()
        reason = refusal.reason.value  # a plain str in the event, as before the enum
        self.emit(rec, refusal.decision, reason, refusal.rule, refusal.detail, status)

    def emit(
        self,
        rec: AccessRecord,
        decision: str,
        reason: str,
        rule: str | None,
        detail: str | None,
        status: int | None,
    ) -> None:
        event = rec.event(decision, reason, rule, detail, status)
        rec.link = 0  # ended: no more progress records
        if self.audit is not None:
            self.audit.record(event)
        metrics = self.metrics
        if metrics is not None:  # the same record's values (docs/metrics.md), read from slots
            pending = metrics.pending
            pending.append(
                (rec.client_id, decision, reason, rec.bytes_up, rec.bytes_down, rec.duration_ms)
            )
            if len(pending) >= BATCH:
                metrics.fold()
        self.observe(event)
        for hook in self.hooks:
            hook(event)

    def release(self, conn: Conn) -> None:
        """A connection ended: its slot is free (admission.py)."""
        self.slots.release(conn)


def _source(conn: Conn) -> object:
    peer = conn.peer
    return ("source", peer[0] if isinstance(peer, tuple) and peer else conn.client)


def _admitted(verdict: Admit, rec: AccessRecord) -> None:
    rec.admitted(verdict.reason, verdict.rule)
    if verdict.would is not None:  # report-only (docs/audit-log.md#report-only-fields)
        rec.would, rec.detail = verdict.would, verdict.detail


__all__ = ["AuditSink", "LifecycleSink", "Steps"]

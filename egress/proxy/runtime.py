"""What every exchange of one running proxy shares: admission, the audit sinks, emitting.

Shell. The order of an exchange's steps is the pure `Exchange`'s (`core/exchange.py`) and
carrying them out is the driver's (`drive/`); this holds the proxy-wide state they use:
connection slots and per-client caps (`admission.py`), open and progress records, the
refusal tally of requests and the log budget, and `emit`, the one place an audit record
leaves (docs/architecture.md#one-exchange). The records of connections that ended before
any exchange are its part `connections` (`connection_records.py`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from ..audit.format import LIFECYCLE_METHODS, encode_record
from ..policy.target import IPAddress
from ..reasons import End
from .admission import Admitted, Budget, Owner, Slots
from .connection_records import ConnectionRecords, source_owner
from .core.actions import Done
from .core.clients import Identity, admission_source
from .core.exchange import Exchange
from .core.gate import Gate, Verdict
from .core.record import AccessRecord, bounded, perf_counter_ns
from .core.responses import error_response
from .fairshare import Turns
from .logbudget import LogBudget, Suppressed
from .net.conn import Conn, Limits, idle_of
from .net.listener import Listener
from .net.pool import UpstreamPool
from .net.resolve import Resolver
from .tally import Tally
from .telemetry.metrics import BATCH, ProxyMetrics

CACHE_MAX = 65536
# refused requests of one client, reason and destination written one by one at the start of
# each second; the rest of that second are counted into one record (`tally.py`,
# docs/audit-log.md#the-budget-per-sandbox)
REQUEST_BURST = 32
# what the writer adds to a record's serialized event: `ts`, `seq`, `prev`, the newline
LINE_OVERHEAD = 120


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
        "_budget",
        "_refused",
        "audit",
        "closing",
        "connections",
        "fast_path",
        "gate",
        "hooks",
        "kept_hits",
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
        *,
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
        # serve kept-alive requests and CONNECT tunnels from callbacks where possible
        # (`drive/callback.py`); off = every request and tunnel takes the coroutine path (tests
        # compare the two)
        self.fast_path = True
        # kept-alive requests decided by their connection's last decision (`core/kept.py`)
        self.kept_hits = 0
        # who holds which connection, from accept (admission.py, docs/proxy.md#limits)
        self.slots: Slots[Conn] = Slots(
            Budget(
                limits.max_connections,
                limits.client_cap,
                limits.unidentified_per_source,
                limits.unidentified_total,
            )
        )
        # records of connections that ended before any exchange (connection_records.py)
        self.connections = ConnectionRecords(loop, self.emit)
        # refused requests, aggregated by client, reason and destination (tally.py), and the
        # byte budget of every client's refusal records (logbudget.py)
        self._refused: Tally[Done] = Tally(burst=REQUEST_BURST)
        self._budget = LogBudget()
        # requests in flight per client, capped while another client is present
        # (fairshare.py, docs/proxy.md#fair-share)
        self.turns = Turns(loop, limits.max_client_inflight, self.slots.others_present)
        self._addr_texts: dict[IPAddress, str] = {}

    # --- admission: a connection belongs to a client from accept (admission.py) --------------
    def admit(self, conn: Conn) -> Verdict | None:
        """Count a new connection: in its client's cap when the listener (or its source
        address) names the client, else in its source's unidentified budget. Closes what
        must make room (an unidentified connection, or the client's own idle one)."""
        peer = conn.peer
        source = str(peer[0] if isinstance(peer, tuple) and peer else conn.client)
        listener = conn.listener
        key = admission_source(source, listener.netns)  # loopback sources: one
        owner: Owner | None = None
        ident = self.gate.clients.identity_at_accept(listener.identity, source)
        if ident is not None:
            owner = ident.client_id if ident.client_id is not None else ("source", key)
        slots = self.slots
        reclaim = None
        if owner is not None and slots.total >= self.limits.max_connections:
            reclaim = idle_of(slots.members(owner))
        verdict = slots.admit(conn, owner, key, self.loop.time(), reclaimable=reclaim is not None)
        if isinstance(verdict, Verdict):
            conn.counted_as(owner)
            return verdict
        conn.counted_as(owner)
        if reclaim is not None and slots.total > self.limits.max_connections:
            reclaim.side.close()  # its own kept-alive connection, between requests
        self._evict(verdict)
        return None

    def refuse_at_accept(self, listener: Listener, peer: object) -> tuple[Verdict, bool] | None:
        """A connection whose client, known from its listener or source address alone, is
        already at its cap: refused and recorded (aggregated) before a `Conn`, a transport
        or a task exists for it, so a flood of them costs little (docs/proxy.md#limits).
        Returns the refusal and whether to answer it in full (`tally.answer_in_full`), or
        None: admit the connection the usual way (`admit`)."""
        if not isinstance(peer, tuple) or not peer:
            return None
        source = peer[0]
        ident = self.gate.clients.identity_at_accept(listener.identity, str(source))
        if ident is None:
            return None
        owner: Owner = ident.client_id
        if owner is None:
            owner = ("source", admission_source(str(source), listener.netns))
        refusal = self.slots.over_cap(owner)
        if refusal is None:
            return None
        return refusal, self.connections.at_accept(peer, listener, owner, refusal)

    def _evict(self, verdict: Admitted[Conn]) -> None:
        for conn in verdict.evicted:
            conn.cut_by(End.EVICTED)
            conn.side.close()

    def overdue(self, now: float) -> None:
        """Close connections still unidentified after `identify_timeout` (the sweeper)."""
        for conn in self.slots.overdue(now, self.limits.identify_timeout):
            if conn.phase in ("head", "hello", "idle") and conn.end is None:
                conn.cut_by(End.IDENTIFY_TIMEOUT)
                conn.side.close()

    def cap(self, conn: Conn, found: Identity | Verdict) -> Verdict | None:
        """Count an identified connection against its client's cap (admission.py): None,
        or the cap's refusal for the exchange to answer (after recording who it was)."""
        if isinstance(found, Verdict):
            return None
        cid = found.client_id
        if conn.owner != cid and (cid is not None or conn.owner is None):
            owner: Owner = cid
            if cid is None:  # the default client: shared by everyone, so per source
                owner = source_owner(conn)
            if owner != conn.owner:
                refusal = self.slots.identify(conn, owner)
                if refusal is not None:
                    return refusal
                conn.counted_as(owner)
        return None

    def link(self, conn: Conn, x: Exchange) -> None:
        """The upstream was contacted: a tunnel's `open` record now, its id kept by the
        exchange; a request's only if it is still running after the interim interval
        (`progress` writes it then), so a short request has exactly one record."""
        audit = self.lifecycle
        if audit is not None:
            rec = x.record
            if x.opens_at_dial:
                x.linked(audit.opened(rec.opened()), self.loop.time())
            else:
                rec.deferred(self.loop.time())

    def done(self, done: Done) -> None:
        """Emit an exchange's final record; a refusal through the tally: refused requests
        of one client, reason and destination past the first few of a second become one
        record with a `count` (docs/audit-log.md#the-budget-per-sandbox)."""
        rec = done.record
        if done.decision == "allow" or rec.link or rec.method in LIFECYCLE_METHODS:
            self.emit(rec, done.decision, done.reason, done.rule, done.detail, done.status)
            return
        key = (_who(rec), done.reason, rec.scheme, rec.host, rec.port)
        for written, count in self._refused.add(key, done, self.loop.time()):
            self._write_refused(written, count)

    def _write_refused(self, done: Done, count: int) -> None:
        detail = done.detail
        if count > 1:
            done.record.tallied(count)
            detail = f"{detail or done.reason} ({count} in one second, this the last)"
        self.emit(done.record, done.decision, done.reason, done.rule, detail, done.status)

    def progress(self, conn: Conn, now: float) -> None:
        """A `progress` record for a long tunnel or exchange (the sweeper calls this every
        `interim_interval`): bytes so far, so a crash loses at most one interval. A request
        still running one interval after its dial gets its deferred `open` record first."""
        rec = conn.rec
        audit = self.lifecycle
        if rec is None or audit is None or now - rec.reported < audit.interim_interval:
            return
        if not rec.link:
            if rec.unopened:
                rec.opened_late(audit.opened(rec.opened()), now)
            return
        rec.progress_written(now)
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

    def addr_text(self, addr: IPAddress) -> str:
        text = self._addr_texts.get(addr)
        if text is None:
            if len(self._addr_texts) > CACHE_MAX:
                self._addr_texts.clear()
            text = self._addr_texts[addr] = str(addr)
        return text

    # --- answers and audit: the one place that answers refusals ------------------------------
    def refuse_now(self, conn: Conn, refusal: Verdict, *, write: bool = True) -> None:
        """Answer and audit a refusal that comes before any request was understood."""
        status, data = error_response(refusal.reason, refusal.detail, status=refusal.status)
        if write:
            conn.side.write(data)
        conn.accounted()
        self.connections.refused(conn, refusal, status)

    def flush_refusals(self, *, everything: bool = False) -> None:
        """Write the counted refusals whose second has ended (the sweeper; stop), then the
        `suppressed` records of the budget windows that ended."""
        now = self.loop.time()
        self.connections.flush(now, everything=everything)
        for done, count in self._refused.due(now, everything=everything):
            self._write_refused(done, count)
        for left_out in self._budget.due(now, everything=everything):
            self._write_suppressed(left_out)

    def _write_suppressed(self, left_out: Suppressed) -> None:
        if self.audit is not None:
            event = left_out.event(self._budget.window)
            if left_out.client_id is not None:
                event["client_id"] = bounded(left_out.client_id)
            self.audit.record(event)

    def _within_budget(self, rec: AccessRecord, event: dict[str, object], reason: str) -> bool:
        """Whether a refusal record fits its client's byte budget of this second
        (logbudget.py); the `suppressed` records of ended windows are written first."""
        size = len(encode_record(event)) + LINE_OVERHEAD
        count = rec.count if rec.count is not None else 1
        client_id = rec.client_id if rec.identified else None
        ok, ended = self._budget.take(
            _who(rec),
            size,
            self.loop.time(),
            count=count,
            reason=reason,
            client=rec.client,
            client_id=client_id,
        )
        for left_out in ended:
            self._write_suppressed(left_out)
        return ok

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
        refusal = decision != "allow" and not rec.link and rec.method not in LIFECYCLE_METHODS
        rec.emitted()  # ended: no more progress records
        if self.audit is not None and (not refusal or self._within_budget(rec, event, reason)):
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
        self.slots.release(conn, self.loop.time())


def _who(rec: AccessRecord) -> object:
    """Whose budget a record is in: its client's id, else its source address, every loopback
    source one (`admission_source`, as for the connection slots): one process binding
    127.0.0.2, 127.0.0.3, ... would otherwise write as many budgets' worth of refusals
    (docs/audit-log.md#the-budget-per-sandbox). The record does not carry the listener's
    namespace, so the loopback sources of every namespace share that one budget: a sandbox
    on a loopback listener of its own is identified by it and keyed by its id above."""
    if rec.identified and rec.client_id is not None:
        return rec.client_id
    return ("source", admission_source(rec.client.rsplit(":", 1)[0].strip("[]"), None))


__all__ = ["AuditSink", "LifecycleSink", "Steps"]

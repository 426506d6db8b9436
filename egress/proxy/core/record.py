"""The access record of one request, tunnel or forwarded connection: one audit line.

Pure. The proxy fills an `AccessRecord` as a request moves through its stages and turns it
into the audit event once, at the end (`event`). The field order of the line is the one
docs/audit-log.md shows: fields appear in the order the stages learned them, so a refusal
carries `decision`, `reason`, `rule` after what was known when it was refused, while an
admitted request carries `rule` and `reason` right after `client_id`.
"""

from __future__ import annotations

from hashlib import sha256
from time import perf_counter_ns
from typing import Final

from ...reasons import End

# Durations come from the monotonic high-resolution counter, never from the event loop's
# clock: uvloop's loop time has whole milliseconds, which made every sub-millisecond
# request 0 or 1 ms in the records, on stderr and in the histograms (docs/audit-log.md).


# The longest text of an agent's choosing a record keeps (a path, a host or target that did
# not parse, an SNI, a detail quoting them): the rest is cut and named by its length and a
# digest, so one request can never make a line of more than a few KiB, and two long paths
# that differ only past the cut still differ (docs/audit-log.md#bounded-fields).
FIELD_LIMIT: Final = 512
BOUNDED_FIELDS: Final = ("path", "host", "detail", "sni", "orig_dst", "client_id")


def bounded(text: str, limit: int = FIELD_LIMIT, *, query: bool = False) -> str:
    """`text`, or its first `limit` characters and `...[+N chars sha256:H]` for the rest,
    H the first 16 hex digits of the SHA-256 of the characters cut (UTF-8, lone surrogates
    kept). With `query` (a path) no digest covers a query string (it may hold a secret:
    docs/audit-log.md#redaction): a query in the cut part is only marked, `?...`, which the
    redaction then replaces as any query."""
    if len(text) <= limit:
        return text
    rest = text[limit:]
    mark = ""
    if query and "?" in rest:
        rest, mark = rest[: rest.index("?")], "?..."
    digest = sha256(rest.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{text[:limit]}...[+{len(text) - limit} chars sha256:{digest}]{mark}"


def bound_fields(ev: dict[str, object]) -> dict[str, object]:
    """`ev` with every field an agent can make long cut to `FIELD_LIMIT` (`bounded`)."""
    for key in BOUNDED_FIELDS:
        value = ev.get(key)
        if isinstance(value, str) and len(value) > FIELD_LIMIT:
            ev[key] = bounded(value, query=key == "path")
    return ev


def seconds_since(t0: int) -> float:
    """Seconds from `t0` (a `perf_counter_ns()` reading) to now."""
    return (perf_counter_ns() - t0) / 1e9


class AccessRecord:
    """What is known so far about one request; `event` renders the audit line's dict."""

    __slots__ = (
        "addr",
        "bytes_down",
        "bytes_up",
        "client",
        "client_id",
        "count",
        "detail",
        "duration_ms",
        "end",
        "host",
        "identified",
        "link",
        "listener",
        "method",
        "mode",
        "orig_dst",
        "path",
        "policy",
        "port",
        "reason",
        "reported",
        "retried",
        "rule",
        "scheme",
        "sni",
        "socks_reply",
        "status",
        "t0",
        "unopened",
        "would",
    )

    def __init__(
        self, client: str, method: str, scheme: str, host: str, port: int, t0: int
    ) -> None:
        self.client = client
        self.method = method
        self.scheme = scheme
        self.host = host
        self.port = port
        self.t0 = t0  # perf_counter_ns() at the start; not logged
        # the `id` of its open record once the upstream was contacted (0: none, or the
        # record was emitted); `reported`: loop time of the open or last progress record
        self.link = 0
        self.reported = 0.0
        # a request that reached its upstream but has no `open` record yet: it gets one only
        # if it outlives the interim interval (docs/audit-log.md#open-and-progress)
        self.unopened = False
        self.path: str | None = None
        self.identified = False  # client_id is logged (even when None) once identified
        self.client_id: str | None = None
        self.reason: str | None = None  # set when admitted, before the dial
        self.rule: str | None = None
        self.addr: str | None = None
        self.status: int | None = None  # set by the exchange, before the end
        self.sni: str | None = None
        self.mode: str | None = None  # socks5 | transparent (docs/audit-log.md)
        self.orig_dst: str | None = None
        self.socks_reply: int | None = None
        self.end: str | None = None
        self.bytes_up: int | None = None
        self.bytes_down: int | None = None
        self.duration_ms: float | None = None
        self.policy: str | None = None  # the deciding policy's hash (docs/policy.md#policy-hash)
        self.would: str | None = None  # report-only: "block" (docs/audit-log.md)
        self.detail: str | None = None  # report-only: the would-be refusal's detail
        self.listener: str | None = None  # connection records: the listener's HOST:PORT
        self.count: int | None = None  # an aggregated refusal: how many it stands for
        # sent again on a fresh upstream once its pooled one closed unanswered (1) or not (0)
        self.retried = 0

    def __repr__(self) -> str:
        return f"AccessRecord({self.method} {self.host}:{self.port} {self.reason})"

    # -- records outside an exchange's sequence (docs/audit-log.md#connection-records) --------
    @classmethod
    def for_connection(
        cls, client: str, t0: int, listener: str, mode: str, end: str | None, owner: object
    ) -> AccessRecord:
        """A connection closed or refused before any exchange: it names the listener, its
        mode and the client when known (`owner`: a client id, or a source)."""
        rec = AccessRecord(client, "-", "", "", 0, t0)
        rec.listener, rec.mode, rec.end = listener, mode, end
        if owner is not None:
            rec.identify(owner if isinstance(owner, str) else None)
        return rec

    @classmethod
    def revoked(
        cls,
        last_rec: AccessRecord,
        t0: int,
        where: tuple[str | None, str | None],
        what: str,
        policy: str,
    ) -> AccessRecord:
        """A kept-alive client connection or a pooled upstream closed between requests
        because a policy change no longer allows the destination of its last request
        (`last_rec`): a connection record (`method: "-"`) naming that destination,
        `end: revoked`. `where` is the listener and its mode, `what` says what was closed,
        `policy` is the hash of the policy that no longer allows it."""
        rec = AccessRecord(last_rec.client, "-", last_rec.scheme, last_rec.host, last_rec.port, t0)
        rec.listener, rec.mode = where
        rec.end = End.REVOKED.value
        rec.addr, rec.orig_dst = last_rec.addr, last_rec.orig_dst
        rec.identify(last_rec.client_id)
        rec.policy = policy
        rec.detail = (
            f"{what} closed between requests: a policy change no longer allows its last destination"
        )
        return rec

    @classmethod
    def probe(
        cls, client: str, where: tuple[str, int], t0: int, orig_dst: str | None, who: str | None
    ) -> AccessRecord:
        """`prepare_execution`'s probe of a transparent listener (method PROBE), ended."""
        rec = AccessRecord(client, "PROBE", "tcp", where[0], where[1], t0)
        rec.mode, rec.orig_dst = "transparent", orig_dst
        rec.identify(who)
        rec.finish()
        return rec

    # -- what the audit writer did with it (`runtime.py`, `tally.py`) --------------------------
    def tallied(self, count: int) -> None:
        """A refusal that stands for `count` of them (`tally.py`)."""
        self.count = count

    def progress_written(self, now: float) -> None:
        """A `progress` record was written at loop time `now`."""
        self.reported = now

    def deferred(self, now: float) -> None:
        """A request went upstream at loop time `now`: its `open` record waits an interim
        interval (docs/audit-log.md#open-and-progress-records)."""
        self.unopened, self.reported = True, now

    def opened_late(self, link: int, now: float) -> None:
        """A deferred request's `open` record was written with id `link` at loop time
        `now`."""
        self.unopened, self.link, self.reported = False, link, now

    def emitted(self) -> None:
        """The record was emitted: no more open or progress records for it."""
        self.link = 0
        self.unopened = False

    def identify(self, client_id: str | None) -> None:
        self.identified = True
        self.client_id = client_id

    def admitted(self, reason: str, rule: str | None) -> None:
        self.reason = reason
        self.rule = rule

    def opened(self) -> dict[str, object]:
        """The fields of its `open` record: who went where, as known at the dial."""
        ev: dict[str, object] = {
            "client": self.client,
            "method": self.method,
            "host": self.host,
            "port": self.port,
            "addr": self.addr,
        }
        if self.identified:
            ev["client_id"] = self.client_id
        if self.mode is not None:
            ev["mode"] = self.mode
        return ev

    def finish(self, now: int | None = None) -> None:
        """Record the duration up to `now` (a `perf_counter_ns()` reading, default: now) in
        milliseconds with 3 decimals (microseconds)."""
        end = perf_counter_ns() if now is None else now
        self.duration_ms = round((end - self.t0) / 1e6, 3)

    def event(
        self,
        decision: str,
        reason: str,
        rule: str | None,
        detail: str | None = None,
        status: int | None = None,
    ) -> dict[str, object]:
        """The audit event (`status`: the answered one, when the exchange set none)."""
        ev: dict[str, object] = {
            "client": self.client,
            "method": self.method,
            "scheme": self.scheme,
            "host": self.host,
            "port": self.port,
        }
        if self.link:
            ev["id"] = self.link
        path = self.path
        if path is not None:
            ev["path"] = path if len(path) <= FIELD_LIMIT else bounded(path, query=True)
        if self.identified:
            ev["client_id"] = self.client_id
        if self.policy is not None:
            ev["policy"] = self.policy
        admitted = self.reason is not None
        forward = self.method == "FORWARD"
        # report-only: what the policy would have done stays in the record whatever happened
        # after the decision (a DNS or connect failure); only the guard's block overrides it
        # (docs/audit-log.md#report-only-fields)
        would = self.would if decision != "block" else None
        if admitted and not forward:
            ev["rule"] = rule if would is None else self.rule
            ev["reason"] = reason
            if would is not None:
                self._would(ev, would, reason)
        if self.addr is not None:
            ev["addr"] = self.addr
        if self.retried:
            ev["retried"] = self.retried
        if admitted and forward:
            ev["reason"] = reason
            ev["rule"] = rule
        if self.status is not None:
            ev["status"] = status if status is not None else self.status
        if self.sni is not None:
            ev["sni"] = self.sni
        if self.mode is not None:
            ev["mode"] = self.mode
        if self.orig_dst is not None:
            ev["orig_dst"] = self.orig_dst
        if self.listener is not None:
            ev["listener"] = self.listener
        if self.socks_reply is not None:
            ev["socks_reply"] = self.socks_reply
        late_end = self.scheme != "http"
        if self.end is not None and not late_end:
            ev["end"] = self.end
        if self.bytes_up is not None:
            ev["bytes_up"] = self.bytes_up
            ev["bytes_down"] = self.bytes_down
        if self.end is not None and late_end:
            ev["end"] = self.end
        if self.duration_ms is not None:
            ev["duration_ms"] = self.duration_ms
        ev["decision"] = decision
        if not admitted:
            ev["reason"] = reason
            ev["rule"] = rule
        if self.status is None and status is not None:
            ev["status"] = status
        if detail is not None or self.detail is not None:
            detail = self._detail(detail, would)
        if detail is not None:
            ev["detail"] = detail
        if self.count is not None:
            ev["count"] = self.count
        # admitted: a canonical destination, the path cut above (docs/audit-log.md#bounded-fields)
        plain = admitted and detail is None and self.sni is None
        return ev if plain else bound_fields(ev)

    def _would(self, ev: dict[str, object], would: str, reason: str) -> None:
        """A report-only refusal's `would` (and `would_reason` if it differs)."""
        ev["would"] = would
        if reason != self.reason:
            ev["would_reason"] = self.reason

    def _detail(self, detail: str | None, would: str | None) -> str | None:
        """The record's `detail`: the one given, after a report-only refusal's own."""
        if detail is None:
            return self.detail
        if would is not None and self.detail is not None and detail != self.detail:
            return f"{self.detail}; then: {detail}"
        return detail


# a DNS answer's rcode, as the record spells it (RFC 1035 and RFC 6895 mnemonics)
RCODE_TEXT = {0: "NOERROR", 1: "FORMERR", 2: "SERVFAIL", 3: "NXDOMAIN", 4: "NOTIMP", 5: "REFUSED"}


class DnsRecord(AccessRecord):
    """The record of one DNS query (docs/audit-log.md#dns-records): what was asked, on which
    transport, and what was answered. Its line has its own fields and order; like every
    record, only the exchange writes its fields (`core/exchange.py`)."""

    __slots__ = ("answer", "qtype", "rcode", "transport")

    def __init__(self, client: str, host: str, t0: int, transport: str, qtype: str) -> None:
        super().__init__(client, "DNS", "dns", host, 53, t0)
        self.transport = transport
        self.qtype = qtype
        self.rcode: int | None = None  # None: dropped unanswered
        self.answer: str | None = None  # the fake address of an answered A query

    def event(
        self,
        decision: str,
        reason: str,
        rule: str | None,
        detail: str | None = None,
        status: int | None = None,
    ) -> dict[str, object]:
        ev: dict[str, object] = {
            "client": self.client,
            "method": self.method,
            "scheme": self.scheme,
            "host": self.host,
            "port": self.port,
            "mode": self.mode,
            "transport": self.transport,
            "client_id": self.client_id,
            "qtype": self.qtype,
            "rcode": RCODE_TEXT.get(self.rcode, str(self.rcode)) if self.rcode is not None else "",
            "decision": decision,
            "reason": reason,
            "rule": rule,
        }
        if self.answer is not None:
            ev["answer"] = self.answer
        if detail is None:
            detail = self.detail
        if detail is not None:
            ev["detail"] = detail
        if self.would is not None:
            ev["would"] = self.would
        return bound_fields(ev)


__all__ = [
    "FIELD_LIMIT",
    "AccessRecord",
    "DnsRecord",
    "bound_fields",
    "bounded",
    "perf_counter_ns",
    "seconds_since",
]

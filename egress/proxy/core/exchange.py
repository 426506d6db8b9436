"""`Exchange`: the proxy's one sequence, as a pure state machine in the style of h11.

Pure. identify -> target -> decide -> resolve -> admit -> dial -> answer -> SNI -> relay ->
record is written once, here; every front-end (`modes/`) and every driver uses it. The driver
calls a method with what happened (`start(intent)`, `resolved(addrs)`, `dialed(addr)`,
`hello(result)`, `sent()`, `response(status)`, `ended(...)`) and gets back the next action
to carry out (`core/actions.py`; `sent()` asks for nothing); a refusal is an action too, so
drivers need no exception to unwind. A request goes on past its dial: its head sent, each
response head read (by `core/reader.py`, for both drivers), its body relayed, so the
record's status, bytes and duration are written here whichever driver carried it.

The decisions are the gate's (`gate.py`), never repeated here; the legal sequences are data
(`sequence.py`, as h11's `_state.py` writes its own), checked on every call; and this (with the
record's own factories, `record.py`) is the one writer of an `AccessRecord`'s fields
(docs/architecture.md#one-exchange).
"""

from __future__ import annotations

from ...policy.rules import Decision
from ...policy.target import IPAddress, Target, parse_ip_literal
from ...reasons import End, Reason
from ..codec.tls_hello import ClientHelloResult
from .actions import (
    READ_HELLO,
    RELAY_REQUEST,
    RELAY_TUNNEL,
    Dial,
    Done,
    ReadHello,
    Refuse,
    Relay,
    ReplyOk,
    Resolve,
)
from .clients import Identity
from .gate import AUDIT_DOWN, Admit, Gate, Verdict, refuse_dial, refuse_resolve, response_step
from .intent import Front, Intent
from .kept import Kept
from .record import AccessRecord, DnsRecord
from .sequence import IDEMPOTENT, TRANSITIONS, SequenceError, State


class Exchange:
    """One request, tunnel or forwarded connection, from its intent to its record."""

    __slots__ = (
        "_answerable",
        "_hello",
        "_hello_first",
        "_refusal",
        "admitted",
        "dialed_addr",
        "first",
        "front",
        "gate",
        "identity",
        "opens_at_dial",
        "record",
        "state",
        "target",
    )

    def __init__(self, gate: Gate, front: Front) -> None:
        self.gate = gate
        self.front = front
        self.state = State.IDLE
        self.record: AccessRecord  # made by `start`
        # what it decided, step by step (a kept-alive connection keeps it: `Kept.reached`)
        self.identity: Identity | None = None
        self.target: Target | None = None
        self.first: Decision | None = None
        self.admitted: Admit | None = None
        self._hello: ClientHelloResult | None = None
        self._hello_first = False
        self._answerable = True
        self._refusal: Verdict | None = None
        # the checked address it was connected to (a pooled upstream goes back under it)
        self.dialed_addr: IPAddress | None = None
        # whether its `open` record is written at the dial: tunnels (CONNECT, SOCKS5,
        # transparent, forwarders) last, a plain request mostly does not, so a request gets
        # one only if it outlives the interim interval (docs/audit-log.md#open-and-progress);
        # attributes, not properties: read on every kept-alive request
        self.opens_at_dial = front.shape != "request"

    @property
    def refusal(self) -> Verdict | None:
        """The verdict it was refused with, if it was."""
        return self._refusal

    @property
    def decided(self) -> bool:
        """True once the policy judged the target (the metrics time head-to-verdict)."""
        return self.first is not None

    # -- the legal sequence ------------------------------------------------------------------
    def _move(self, event: str, to: State) -> None:
        allowed = TRANSITIONS[event].get(self.state)
        if allowed is None or to not in allowed:
            raise SequenceError(f"exchange: {event} in state {self.state.value}")
        self.state = to

    def _check(self, event: str) -> None:
        if self.state not in TRANSITIONS[event]:
            raise SequenceError(f"exchange: {event} in state {self.state.value}")

    # -- events ------------------------------------------------------------------------------
    def start(self, intent: Intent) -> Refuse | Resolve | Dial | Done:
        """The front-end's intent: identify, target, the verdict on the name (a DNS query's
        exchange may end here: `Done`, answered without an address)."""
        self._check("start")
        if self.front.shape == "lookup":
            return self._lookup(intent)
        rec = self.record = AccessRecord(
            intent.client, intent.method, intent.scheme, intent.host, intent.port, intent.t0
        )
        rec.path = intent.path
        rec.mode, rec.orig_dst = self.front.record_mode, intent.orig_dst
        identity, target = intent.identity, intent.target
        self._hello, self._hello_first = intent.hello, intent.hello_first
        self._answerable = intent.answerable
        if self.front.shape == "route":
            return self._route(intent)
        if isinstance(identity, Identity):
            rec.identify(identity.client_id)
            rec.policy = identity.policy.digest  # docs/policy.md#policy-hash
        if isinstance(target, Target):
            rec.host, rec.port = target.host, target.port
        hello = intent.hello
        if hello is not None and hello.kind == "tls" and hello.sni is not None:
            rec.sni = hello.sni
        if isinstance(target, Verdict):
            if target.where is not None:  # named before it was refused (ws://)
                rec.host, rec.port = target.where
            if intent.listener is not None:  # no destination: the listener says where
                rec.listener, rec.mode = intent.listener
            return self._refuse("start", target)
        if isinstance(identity, Verdict):
            return self._refuse("start", identity)
        if intent.cap is not None:
            return self._refuse("start", intent.cap)
        if identity is None or target is None:
            raise SequenceError("exchange: an intent without its identity or target")
        self.identity, self.target = identity, target
        if not intent.audit_ok:  # closed mode: docs/audit-log.md
            return self._refuse("start", AUDIT_DOWN)
        first = self.first = self.gate.decide(identity.policy, target)
        early = self.gate.refuse_early(first)
        if early is not None:
            return self._refuse("start", early)
        then = intent.then
        if then is not None:  # ws://: the policy had its say, now the 400
            if then.where is not None:
                rec.host, rec.port = then.where
            return self._refuse("start", then)
        if first.would is not None:  # kept if the lookup or the dial fails after it
            rec.admitted(first.reason, first.rule)
            rec.would, rec.detail = first.would, first.detail
        if target.ip is not None:
            return self._admit("start", (target.ip,))
        self._move("start", State.RESOLVING)
        return Resolve(target.host)

    def start_kept(
        self, client: str, method: str, path: str, t0: int, orig_dst: str | None, kept: Kept
    ) -> Dial:
        """A kept-alive request the connection's last decision holds for (`core/kept.py`:
        the same client, policy, guard and destination): its record as `start` and the
        admission would write it, and the `Dial` of the addresses checked then."""
        target = kept.target
        rec = self.record = AccessRecord(client, method, "http", target.host, target.port, t0)
        rec.path = path
        rec.mode, rec.orig_dst = self.front.record_mode, orig_dst
        rec.identified, rec.client_id = True, kept.identity.client_id
        rec.policy = kept.policy
        rec.reason, rec.rule = kept.reason, kept.rule
        rec.would, rec.detail = kept.would, kept.detail
        self.identity, self.target = kept.identity, target
        self.first, self.admitted = kept.first, kept.admitted
        self._move("start_kept", State.DIALING)
        return kept.dial

    def resolved(self, addrs: tuple[IPAddress, ...]) -> Refuse | Dial | Done:
        """The name's addresses: the verdict on them (address rules, the guard); a DNS
        query's lookup is answered with the first (its fake address)."""
        self._check("resolved")
        if self.front.shape == "lookup":
            rec = self.record
            assert isinstance(rec, DnsRecord)
            rec.answer = str(addrs[0])
            return self._answered("resolved")
        return self._admit("resolved", addrs)

    def resolve_failed(self, err: BaseException | Verdict) -> Refuse:
        """No address: `err` is the lookup's failure, or the refusal it already is (a DNS
        query's full fake-address pool)."""
        self._check("resolve_failed")
        if not isinstance(err, Verdict):
            err = refuse_resolve(err, self.record.host)
        return self._refuse("resolve_failed", err)

    def dial_failed(self, err: BaseException | Verdict, addr: IPAddress | None = None) -> Refuse:
        """No address answered: `err` is the last failure, at `addr` (or the pool's own
        refusal, which names its address)."""
        self._check("dial_failed")
        if not isinstance(err, Verdict):
            if addr is None:
                raise SequenceError("exchange: dial_failed needs the address that failed")
            err = refuse_dial(err, addr, self.record.port)
        return self._refuse("dial_failed", err)

    def dialed(self, addr: IPAddress, text: str | None = None) -> ReplyOk | Relay:
        """Connected to `addr` (`text`: its spelling, when the driver caches them)."""
        front = self.front
        ok = front.ok
        request = front.shape == "request"  # its head is sent next (`sent`)
        to = State.REPLYING if ok is not None else State.SENDING if request else State.RELAYING
        self._move("dialed", to)
        rec = self.record
        self.dialed_addr = addr
        rec.addr = text if text is not None else str(addr)
        if front.shape == "route":
            rec.admitted(Reason.FRAMEWORK_ROUTE.value, f"http://{rec.host}:{rec.port}")
        if ok is None:
            return RELAY_REQUEST if request else RELAY_TUNNEL
        if ok.style == "http":
            rec.status = ok.code
        elif ok.style == "socks5":
            rec.socks_reply = ok.code
        return ReplyOk(ok)

    def linked(self, link: int, reported: float) -> None:
        """The `open` record was written with id `link` (docs/audit-log.md#open-and-progress)."""
        rec = self.record
        rec.link, rec.reported = link, reported

    def replied(self) -> ReadHello | Relay:
        """The `ReplyOk` went out: read the ClientHello where the gate wants its SNI."""
        self._check("replied")
        identity, target = self.identity, self.target
        if identity is not None and target is not None:
            if self.gate.wants_sni(identity.policy, target):
                self._move("replied", State.HELLO)
                return READ_HELLO
        self._move("replied", State.RELAYING)
        return RELAY_TUNNEL

    def hello(self, result: ClientHelloResult | None) -> Refuse | Relay:
        """The tunnel's first bytes (None: the client closed without any)."""
        self._check("hello")
        rec = self.record
        if result is not None and result.sni is not None and result.kind == "tls":
            rec.sni = result.sni
        refused = self._sni(result)
        if refused is not None:
            return self._refuse("hello", refused)
        self._move("hello", State.RELAYING)
        return RELAY_TUNNEL

    def sent(self) -> None:
        """The request head went upstream (again, after a `retry`): nothing to carry out, its
        response is read next, each head reported with `response` (`core/reader.py` does,
        for both drivers). `TRANSITIONS["sent"]` is checked inline: a call fewer per request."""
        if self.state is not State.SENDING:
            raise SequenceError(f"exchange: sent in state {self.state.value}")
        self.state = State.AWAITING

    def response(self, status: int) -> Refuse | Relay:
        """An upstream response head: a 1xx is relayed and more is read, a 101 is refused, a
        final status is recorded and its body relayed."""
        step = response_step(status)
        if isinstance(step, Verdict):
            self._check("response")
            return self._refuse("response", step)
        if step == "final":
            self._move("response", State.RELAYING)  # (checked before anything is written)
            self.record.status = status
        else:
            self._move("response", State.AWAITING)
        return RELAY_REQUEST

    def retry(self, bodiless: bool) -> Dial | None:
        """Its pooled upstream closed before any byte of a response (the origin let go of
        an idle kept-alive connection as it was reused): a request that may be sent again
        (RFC 9110 section 9.2.2: an idempotent method; `bodiless`: no body was streamed) is
        sent once more on a fresh connection to the address already checked, never
        resolved again (docs/proxy.md#upstream-pool). The `Dial` of that address
        alone, or None (then refused as before: 502). Its record says `retried: 1`; its head
        is sent again (`sent`)."""
        self._check("retry")
        rec = self.record
        addr = self.dialed_addr
        if rec.retried or addr is None or not bodiless or rec.method not in IDEMPOTENT:
            return None
        rec.retried = 1
        self._move("retry", State.SENDING)
        return Dial((addr,), rec.port, False)

    def ended(self, how: str | None, up: int, down: int, now: int | None = None) -> Done:
        """The relay ended: `how` it ended (`reasons.End`, None: a response that completed)
        and the bytes each way; the record is final."""
        self._move("ended", State.DONE)  # (checked before anything is written)
        rec = self.record
        rec.bytes_up, rec.bytes_down = up, down
        if how is not None:
            rec.end = how
        rec.finish(now)
        front = self.front
        status = rec.status if front.shape == "request" else front.end_status
        return Done(rec, "allow", rec.reason or "", rec.rule, None, status)

    def refuse(self, verdict: Verdict, now: int | None = None) -> Refuse:
        """A refusal from outside the sequence (a per-client cap, a broken request body, an
        upstream that answered nonsense): answered and recorded as the sequence's own."""
        self._check("refuse")
        return self._refuse("refuse", verdict, now)

    # -- the steps ---------------------------------------------------------------------------
    def _lookup(self, intent: Intent) -> Refuse | Resolve | Done:
        """A DNS query: the verdict on the name (any port), then its fake address for an A
        query (`Resolve`: the sandbox's pool), else an answer without one (NODATA)."""
        question = intent.question
        if question is None:
            raise SequenceError("exchange: a DNS intent without its question")
        rec = self.record = DnsRecord(
            intent.client, intent.host, intent.t0, question.transport, question.qtype
        )
        rec.mode = self.front.record_mode
        identity, target = intent.identity, intent.target
        rec.identify(identity.client_id if isinstance(identity, Identity) else None)
        self._answerable = intent.answerable
        if isinstance(target, Verdict):  # a malformed query
            return self._refuse("start", target)
        if not intent.audit_ok:
            return self._refuse("start", AUDIT_DOWN)
        if not isinstance(identity, Identity):
            raise SequenceError("exchange: a DNS intent without its listener's identity")
        verdict = self.gate.lookup(identity.policy, intent.host)
        if isinstance(verdict, Verdict):
            return self._refuse("start", verdict)
        rec.admitted(verdict.reason, verdict.rule)
        if verdict.would is not None:  # report-only (docs/audit-log.md#report-only-fields)
            rec.would, rec.detail = verdict.would, verdict.detail
        if question.qtype == "A":
            self._move("start", State.RESOLVING)
            return Resolve(intent.host)
        return self._answered("start")  # AAAA, CNAME...: NOERROR without data

    def _answered(self, event: str) -> Done:
        rec = self.record
        assert isinstance(rec, DnsRecord)
        rec.rcode = 0  # NOERROR
        self._move(event, State.DONE)
        return Done(rec, "allow", rec.reason or "", rec.rule, None, None)

    def _route(self, intent: Intent) -> Refuse | Resolve | Dial:
        """A forwarder: no policy (its framework route decides), the client its listener's."""
        rec = self.record
        identity = intent.identity
        rec.identify(identity.client_id if isinstance(identity, Identity) else None)
        if not intent.audit_ok:
            return self._refuse("start", AUDIT_DOWN)
        ip = parse_ip_literal(intent.host)
        if ip is not None:
            self._move("start", State.DIALING)
            return Dial((ip,), intent.port, pooled=False)
        self._move("start", State.RESOLVING)
        return Resolve(intent.host)

    def _admit(self, event: str, addrs: tuple[IPAddress, ...]) -> Refuse | Dial:
        rec = self.record
        if self.front.shape == "route":
            self._move(event, State.DIALING)
            return Dial(addrs, rec.port, pooled=False)
        identity, target, first = self.identity, self.target, self.first
        assert identity is not None
        assert target is not None
        assert first is not None
        verdict = self.gate.admit(identity.policy, target, first, addrs)
        if isinstance(verdict, Verdict):
            return self._refuse(event, verdict)
        self.admitted = verdict
        rec.admitted(verdict.reason, verdict.rule)
        if verdict.would is not None:  # report-only (docs/audit-log.md#report-only-fields)
            rec.would, rec.detail = verdict.would, verdict.detail
        hello = self._hello
        if self._hello_first and (hello is None or hello.kind != "tls" or hello.sni is None):
            # transparent TLS without SNI: only the no-SNI rule applies (its SNI is the name)
            refused = self._sni(hello)
            if refused is not None:
                return self._refuse(event, refused)
        self._move(event, State.DIALING)
        return Dial(addrs, target.port, pooled=self.front.shape == "request")

    def _sni(self, hello: ClientHelloResult | None) -> Verdict | None:
        """The gate's SNI verdict; under report-only the tunnel goes on and the record says
        what would have happened (the first would-be refusal: docs/audit-log.md)."""
        identity, target, admitted = self.identity, self.target, self.admitted
        assert identity is not None
        assert target is not None
        assert admitted is not None
        verdict = self.gate.sni(identity.policy, target, admitted, hello)
        if not isinstance(verdict, Verdict):
            return None
        if not identity.policy.report_only:
            return verdict
        rec = self.record
        if rec.would is None:
            rec.would, rec.reason, rec.rule = "block", verdict.reason.value, None
            rec.detail = f"report-only, would block: {verdict.detail}"
        return None

    def _refuse(self, event: str, verdict: Verdict, now: int | None = None) -> Refuse:
        rec = self.record
        front = self.front
        self._refusal = verdict
        answered = self.state in (State.HELLO, State.RELAYING) and front.ok is not None
        answer = front.refusal(verdict, answered or not self._answerable)
        status: int | None = None
        if answer.style == "http":
            status = answer.code
        elif answered and front.ok is not None and front.ok.style == "http":
            status = front.ok.code  # refused after its `200` (SNI): closed, nothing to say
        elif answer.style == "socks5":
            rec.socks_reply = answer.code
        elif answer.style == "reset":
            rec.end = End.RESET.value
        elif answer.style == "dns" and isinstance(rec, DnsRecord):
            rec.rcode = answer.code
        rec.finish(now)
        self._move(event, State.DONE)
        rule = None if front.shape == "route" else verdict.rule
        reason = verdict.reason.value  # a plain str in the event, as before the enum
        decision = front.decision(verdict.reason)
        done = Done(rec, decision, reason, rule, verdict.detail, status)
        return Refuse(verdict, answer, done)


__all__ = [
    "IDEMPOTENT",
    "TRANSITIONS",
    "Exchange",
    "SequenceError",
    "State",
]

"""The exchange as playbooks (mitmproxy's `tutils.Playbook` style): events in, actions out.

No sockets, no loop, no root. For every front-end that runs an `Exchange` (HTTP forward,
CONNECT, framework forwarder, SOCKS5, transparent) the success path and each refusal stage
are written as the exact sequence of events and the action each one must produce; the
records the exchange writes are checked field by field. The fast/slow path equivalence is a
unit test here: whatever the driver (callbacks with a resolver cache hit, or a coroutine
awaiting the lookup), the same events give the same actions and the same record.
"""

from __future__ import annotations

import base64
import ipaddress
from typing import Any

import pytest
from playbook import Ended, Playbook, Refused, done_of, ev

from egress.config import ClientSpec, Settings
from egress.policy.addrs import AddressGuard
from egress.policy.rules import Policy
from egress.policy.target import IPAddress, Target, make_target
from egress.proxy.codec.tls_hello import MALFORMED, ClientHelloResult
from egress.proxy.core.actions import Dial, Done, ReadHello, Refuse, Relay, ReplyOk, Resolve
from egress.proxy.core.clients import ClientTable, Identity
from egress.proxy.core.exchange import TRANSITIONS, Exchange, SequenceError, State
from egress.proxy.core.gate import Gate, Verdict, refuse_request
from egress.proxy.core.intent import CLOSE, RESET, Answer, Front, Intent
from egress.proxy.modes.kinds import CONNECT, FORWARDER, HTTP, SOCKS5, TRANSPARENT, TRANSPARENT_HTTP
from egress.proxy.net.resolve import ResolveError
from egress.reasons import End, Reason

WORLD = ipaddress.ip_address("198.18.7.10")
LOOP = ipaddress.ip_address("127.0.0.1")
PEER = ("198.18.0.5", 40000)
ALLOW_X = Policy(allow=["x.test"])
TOKEN = "s3cret"


def make_gate(policy: Policy = ALLOW_X, *, sni_missing: str = "if-named") -> Gate:
    spec = ClientSpec("task-1", policy, token=TOKEN)
    table = ClientTable(Settings(policy, clients=(spec,)), require_auth=True)
    return Gate(table, AddressGuard(), sni_missing)  # type: ignore[arg-type]


def basic(text: str) -> str:
    return "Basic " + base64.b64encode(text.encode()).decode()


def who(g: Gate, authorization: str | None = basic(f"task-1:{TOKEN}")) -> Identity | Verdict:
    return g.identify_credential(None, PEER, authorization)


def intent(
    g: Gate,
    authority: str = "x.test:443",
    *,
    method: str = "CONNECT",
    authorization: str | None = basic(f"task-1:{TOKEN}"),
    audit_ok: bool = True,
    **extra: Any,
) -> Intent:
    """A CONNECT-like intent as a front-end builds it: the gate's target, then identity."""
    target = g.connect_target(authority)
    identity = None if isinstance(target, Verdict) else who(g, authorization)
    host, _, port = authority.rpartition(":")
    return Intent(
        "198.18.0.5",
        method,
        "https",
        host,
        int(port),
        0,
        target,
        identity,
        audit_ok=audit_ok,
        **extra,
    )


def request_intent(g: Gate, url: str = "http://x.test/a", **extra: Any) -> Intent:
    parsed = g.request_target(url)
    if isinstance(parsed, Verdict):
        return Intent("198.18.0.5", "GET", "http", "", 0, 0, parsed, None)
    target, path, _ = parsed
    return Intent("198.18.0.5", "GET", "http", "", 0, 0, target, who(g), path=path, **extra)


# -- CONNECT -------------------------------------------------------------------------------------
def test_connect_success_with_sni() -> None:
    g = make_gate()
    book = Playbook(Exchange(g, CONNECT))
    assert (
        book
        >> ev.start(intent(g))
        << Resolve("x.test")
        >> ev.resolved((WORLD,))
        << Dial((WORLD,), 443, pooled=False)
        >> ev.dialed(WORLD)
        << ReplyOk(Answer("http", 200))
        >> ev.replied()
        << ReadHello()
        >> ev.hello(ClientHelloResult("tls", "x.test"))
        << Relay(request=False)
        >> ev.ended(End.EOF.value, 10, 20)
        << Ended(Reason.ALLOW_RULE, 200)
    )
    event = done_of(book).record.event("allow", "allow_rule", "x.test", None, 200)
    assert event["client_id"] == "task-1"
    assert event["addr"] == "198.18.7.10"
    assert event["sni"] == "x.test"
    assert (event["status"], event["end"], event["bytes_up"], event["bytes_down"]) == (
        200,
        "eof",
        10,
        20,
    )
    assert event["policy"] == ALLOW_X.digest
    assert book.exchange.state is State.DONE


def test_connect_without_sni_check_relays_after_reply() -> None:
    g = make_gate(Policy(allow=["x.test:8443"]))
    assert (
        Playbook(Exchange(g, CONNECT))
        >> ev.start(intent(g, "x.test:8443"))
        << Resolve("x.test")
        >> ev.resolved((WORLD,))
        << Dial((WORLD,), 8443, pooled=False)
        >> ev.dialed(WORLD)
        << ReplyOk(Answer("http", 200))
        >> ev.replied()
        << Relay(request=False)
    )


def test_connect_ip_literal_dials_without_resolving() -> None:
    g = make_gate(Policy(allow=["198.18.7.10"]))
    assert (
        Playbook(Exchange(g, CONNECT))
        >> ev.start(intent(g, "198.18.7.10:443"))
        << Dial((WORLD,), 443, pooled=False)
    )


CONNECT_REFUSALS = [
    # (stage, events after start, reason, authority, HTTP status); a lookup is answered by
    # `Resolve`, each event but the last by a `Dial`
    ("target", [], Reason.BAD_REQUEST, "x.test:99999", 400),
    ("identity", [], Reason.AUTH_FAILED, "x.test:443", 407),
    ("audit", [], Reason.AUDIT_UNAVAILABLE, "x.test:443", 503),
    ("policy", [], Reason.DEFAULT_DENY, "y.test:443", 403),
    ("port", [], Reason.PORT_NOT_ALLOWED, "x.test:22", 403),
    (
        "resolve",
        [ev.resolve_failed(ResolveError("no such name"))],
        Reason.DNS_ERROR,
        "x.test:443",
        502,
    ),
    ("resolve timeout", [ev.resolve_failed(TimeoutError())], Reason.DNS_TIMEOUT, "x.test:443", 504),
    ("address", [ev.resolved((LOOP,))], Reason.RESERVED_ADDRESS, "x.test:443", 403),
    (
        "dial",
        [ev.resolved((WORLD,)), ev.dial_failed(ConnectionRefusedError(), WORLD)],
        Reason.CONNECTION_REFUSED,
        "x.test:443",
        502,
    ),
    (
        "dial timeout",
        [ev.resolved((WORLD,)), ev.dial_failed(TimeoutError(), WORLD)],
        Reason.CONNECTION_TIMEOUT,
        "x.test:443",
        504,
    ),
]


def _refusal_intent(g: Gate, stage: str, authority: str) -> Intent:
    if stage == "identity":
        return intent(g, authority, authorization=basic("task-1:nope"))
    return intent(g, authority, audit_ok=stage != "audit")


def _after_start(book: Playbook, host: str, port: int, events: list[Any]) -> Playbook:
    if events:
        book = book << Resolve(host)
        for i, event in enumerate(events):
            book = book >> event
            if i < len(events) - 1:
                book = book << Dial((WORLD,), port, pooled=False)
    return book


@pytest.mark.parametrize("front", [CONNECT, SOCKS5, TRANSPARENT], ids=lambda f: f.name)
@pytest.mark.parametrize("row", CONNECT_REFUSALS, ids=[r[0] for r in CONNECT_REFUSALS])
def test_tunnel_refusal_stages(front: Front, row: tuple[Any, ...]) -> None:
    """Each refusal stage of a tunnel, in each tunnel front-end: answered in its protocol
    (HTTP status, the SOCKS5 table's reply, a reset), recorded with the same reason."""
    stage, events, reason, authority, status = row
    g = make_gate()
    answer = Answer("http", status) if front is CONNECT else front.answer(reason)
    record_status = status if front is CONNECT else None
    book = Playbook(Exchange(g, front)) >> ev.start(_refusal_intent(g, stage, authority))
    book = _after_start(book, "x.test", 443, events)
    assert book << Refused(reason, answer, record_status)
    rec = done_of(book).record
    assert rec.socks_reply == (answer.code if front is SOCKS5 else None)
    assert rec.end == (End.RESET.value if front is TRANSPARENT else None)
    assert rec.mode == front.record_mode


def test_sni_refusal_after_reply_closes_and_keeps_the_200() -> None:
    g = make_gate()
    book = (
        Playbook(Exchange(g, CONNECT))
        >> ev.start(intent(g))
        << Resolve("x.test")
        >> ev.resolved((WORLD,))
        << Dial((WORLD,), 443, pooled=False)
        >> ev.dialed(WORLD)
        << ReplyOk(Answer("http", 200))
        >> ev.replied()
        << ReadHello()
        >> ev.hello(ClientHelloResult("tls", "evil.test"))
        << Refused(Reason.SNI_MISMATCH, CLOSE, 200)
    )
    assert book
    assert done_of(book).record.sni == "evil.test"


def test_sni_report_only_relays_and_records_what_would_happen() -> None:
    policy = Policy(allow=["x.test"], report_only=True)
    g = make_gate(policy)
    book = (
        Playbook(Exchange(g, CONNECT))
        >> ev.start(intent(g))
        << Resolve("x.test")
        >> ev.resolved((WORLD,))
        << Dial((WORLD,), 443, pooled=False)
        >> ev.dialed(WORLD)
        << ReplyOk(Answer("http", 200))
        >> ev.replied()
        << ReadHello()
        >> ev.hello(ClientHelloResult("tls", "evil.test"))
        << Relay(request=False)
        >> ev.ended(End.EOF.value, 1, 1)
        << Ended(Reason.SNI_MISMATCH, 200)
    )
    assert book
    rec = done_of(book).record
    assert rec.would == "block"
    assert rec.detail is not None
    assert rec.detail.startswith("report-only, would block: SNI 'evil.test'")


# -- HTTP forward --------------------------------------------------------------------------------
def test_http_request_success_with_interim_response() -> None:
    g = make_gate()
    book = (
        Playbook(Exchange(g, HTTP))
        >> ev.start(request_intent(g))
        << Resolve("x.test")
        >> ev.resolved((WORLD,))
        << Dial((WORLD,), 80, pooled=True)
        >> ev.dialed(WORLD)
        << Relay(request=True)
        >> ev.sent()
        << None
        >> ev.response(100)
        << Relay(request=True)
        >> ev.response(204)
        << Relay(request=True)
        >> ev.ended(None, 5, 7)
        << Ended(Reason.ALLOW_RULE, 204)
    )
    assert book
    event = done_of(book).record.event("allow", "allow_rule", "x.test", None, 204)
    assert (event["method"], event["path"], event["status"]) == ("GET", "/a", 204)
    assert "end" not in event


@pytest.mark.parametrize(
    ("url", "events", "reason", "status"),
    [
        ("/origin-form", [], Reason.BAD_REQUEST, 400),
        ("http://y.test/", [], Reason.DEFAULT_DENY, 403),
        ("http://x.test/", [ev.resolve_failed(ResolveError("gone"))], Reason.DNS_ERROR, 502),
        ("http://x.test/", [ev.resolved((LOOP,))], Reason.RESERVED_ADDRESS, 403),
    ],
    ids=["target", "policy", "resolve", "address"],
)
def test_http_refusal_stages(
    url: str, events: list[tuple[str, tuple[object, ...]]], reason: Reason, status: int
) -> None:
    g = make_gate()
    book = Playbook(Exchange(g, HTTP)) >> ev.start(request_intent(g, url))
    if events:
        book = book << Resolve("x.test") >> events[0]
    assert book << Refused(reason, Answer("http", status), status)


def test_http_refusal_after_dial_and_101() -> None:
    g = make_gate()
    base = lambda: (  # noqa: E731
        Playbook(Exchange(g, HTTP))
        >> ev.start(request_intent(g))
        << Resolve("x.test")
        >> ev.resolved((WORLD,))
        << Dial((WORLD,), 80, pooled=True)
    )
    assert (
        base()
        >> ev.dial_failed(OSError(113, "No route to host"), WORLD)
        << Refused(Reason.UPSTREAM_ERROR, Answer("http", 502), 502)
    )
    assert (
        base()
        >> ev.dialed(WORLD)
        << Relay(request=True)
        >> ev.sent()
        << None
        >> ev.response(101)
        << Refused(Reason.UPSTREAM_ERROR, Answer("http", 502), 502)
    )
    # a refusal from outside the sequence (a malformed body): still the exchange's record
    book = base() >> ev.dialed(WORLD) << Relay(request=True)
    assert (
        book
        >> ev.refuse(refuse_request("malformed request body"))
        << Refused(Reason.BAD_REQUEST, Answer("http", 400), 400)
    )


def test_http_status_override_is_answered() -> None:
    """A refusal with its own status (505 for HTTP/2, 431) is answered with it."""
    g = make_gate()
    x = Exchange(g, HTTP)
    x.start(request_intent(g))
    action = x.refuse(Verdict(Reason.BAD_REQUEST, "version", status=505))
    assert action.answer == Answer("http", 505)
    assert action.done.status == 505


def test_transparent_http_records_its_mode() -> None:
    g = make_gate()
    book = (
        Playbook(Exchange(g, TRANSPARENT_HTTP))
        >> ev.start(request_intent(g, orig_dst="198.18.7.10:80"))
        << Resolve("x.test")
    )
    assert book
    assert book.exchange.record.mode == "transparent"
    assert book.exchange.record.orig_dst == "198.18.7.10:80"


# -- SOCKS5 --------------------------------------------------------------------------------------
def test_socks5_success_records_its_reply() -> None:
    g = make_gate()
    book = (
        Playbook(Exchange(g, SOCKS5))
        >> ev.start(intent(g))
        << Resolve("x.test")
        >> ev.resolved((WORLD,))
        << Dial((WORLD,), 443, pooled=False)
        >> ev.dialed(WORLD)
        << ReplyOk(Answer("socks5", 0))
        >> ev.replied()
        << ReadHello()
        >> ev.hello(ClientHelloResult("tls", "x.test"))
        << Relay(request=False)
        >> ev.ended(End.EOF.value, 1, 2)
        << Ended(Reason.ALLOW_RULE, None)
    )
    assert book
    event = done_of(book).record.event("allow", "allow_rule", "x.test", None, None)
    assert (event["mode"], event["socks_reply"]) == ("socks5", 0)
    assert "status" not in event


def test_socks5_refused_at_authentication_has_no_target_and_no_reply() -> None:
    """Refused in the RFC 1929 sub-negotiation: no request yet, so no RFC 1928 reply (the
    front-end answers the authentication itself), nothing recorded as `socks_reply`."""
    g = make_gate()
    auth = who(g, basic("task-1:nope"))
    book = Playbook(Exchange(g, SOCKS5)) >> ev.start(
        Intent("198.18.0.5", "CONNECT", "https", "", 0, 0, None, auth, answerable=False)
    )
    assert book << Refused(Reason.AUTH_FAILED, CLOSE, None)
    rec = done_of(book).record
    assert (rec.host, rec.socks_reply, rec.mode) == ("", None, "socks5")


# -- transparent ---------------------------------------------------------------------------------
def test_transparent_tls_judged_by_sni_read_first() -> None:
    g = make_gate()
    hello = ClientHelloResult("tls", "x.test")
    target = make_target("https", "x.test", 443)
    book = (
        Playbook(Exchange(g, TRANSPARENT))
        >> ev.start(
            Intent(
                "198.18.0.5",
                "CONNECT",
                "https",
                "x.test",
                443,
                0,
                target,
                who(g),
                orig_dst="198.18.7.10:443",
                hello=hello,
                hello_first=True,
            )
        )
        << Resolve("x.test")
        >> ev.resolved((WORLD,))
        << Dial((WORLD,), 443, pooled=False)
        >> ev.dialed(WORLD)
        << Relay(request=False)
        >> ev.ended(End.EOF.value, 3, 4)
        << Ended(Reason.ALLOW_RULE, None)
    )
    assert book
    assert done_of(book).record.sni == "x.test"


def test_transparent_tls_without_sni_under_deny_is_reset() -> None:
    g = make_gate(sni_missing="deny")
    target = make_target("https", "x.test", 443)
    assert (
        Playbook(Exchange(g, TRANSPARENT))
        >> ev.start(
            Intent(
                "198.18.0.5",
                "CONNECT",
                "https",
                "x.test",
                443,
                0,
                target,
                who(g),
                hello=ClientHelloResult("tls"),
                hello_first=True,
            )
        )
        << Resolve("x.test")
        >> ev.resolved((WORLD,))
        << Refused(Reason.SNI_MISSING, RESET, None)
    )


def test_transparent_malformed_hello_is_reset() -> None:
    g = make_gate()
    malformed = Verdict(Reason.SNI_MISMATCH, "malformed TLS ClientHello")
    assert (
        Playbook(Exchange(g, TRANSPARENT))
        >> ev.start(
            Intent(
                "198.18.0.5",
                "CONNECT",
                "https",
                "x.test",
                443,
                0,
                malformed,
                who(g),
                hello=MALFORMED,
                hello_first=True,
            )
        )
        << Refused(Reason.SNI_MISMATCH, RESET, None)
    )


# -- framework forwarder -------------------------------------------------------------------------
def forwarder_intent(host: str = "198.18.7.10", *, audit_ok: bool = True) -> Intent:
    bound = Identity("task-1", ALLOW_X)
    return Intent("198.18.0.5", "FORWARD", "tcp", host, 8080, 0, None, bound, audit_ok=audit_ok)


def test_forwarder_success_admits_its_route() -> None:
    g = make_gate()
    book = (
        Playbook(Exchange(g, FORWARDER))
        >> ev.start(forwarder_intent())
        << Dial((WORLD,), 8080, pooled=False)
        >> ev.dialed(WORLD)
        << Relay(request=False)
        >> ev.ended(End.EOF.value, 1, 1)
        << Ended(Reason.FRAMEWORK_ROUTE, 200)
    )
    assert book
    rec = done_of(book).record
    assert (rec.rule, rec.client_id, rec.policy) == ("http://198.18.7.10:8080", "task-1", None)


@pytest.mark.parametrize(
    ("events", "reason"),
    [
        ([], Reason.AUDIT_UNAVAILABLE),
        ([ev.resolve_failed(ResolveError("gone"))], Reason.DNS_ERROR),
        ([ev.resolved((WORLD,)), ev.dial_failed(TimeoutError(), WORLD)], Reason.CONNECTION_TIMEOUT),
    ],
    ids=["audit", "resolve", "dial"],
)
def test_forwarder_refusal_stages(
    events: list[tuple[str, tuple[object, ...]]], reason: Reason
) -> None:
    g = make_gate()
    book = Playbook(Exchange(g, FORWARDER)) >> ev.start(
        forwarder_intent("route.test", audit_ok=bool(events))
    )
    book = _after_start(book, "route.test", 8080, events)
    assert book << Refused(reason, CLOSE, None)
    assert done_of(book).rule is None


# -- the sequence as data ------------------------------------------------------------------------
def test_illegal_events_are_driver_bugs() -> None:
    g = make_gate()
    x = Exchange(g, CONNECT)
    with pytest.raises(SequenceError):
        x.dialed(WORLD)  # before start
    x.start(intent(g))
    with pytest.raises(SequenceError):
        x.replied()  # still resolving
    x.resolved((WORLD,))
    x.dialed(WORLD)
    x.replied()
    with pytest.raises(SequenceError):
        x.response(200)  # not a request
    x.hello(None)
    x.ended("eof", 0, 0)
    with pytest.raises(SequenceError):
        x.refuse(refuse_request("late"))  # done


# -- fast/slow path equivalence ------------------------------------------------------------------
EQUIVALENCE = [
    ("x.test:443", (WORLD,)),
    ("x.test:443", (LOOP,)),
    ("y.test:443", (WORLD,)),
    ("198.18.7.10:443", ()),
    ("x.test:22", (WORLD,)),
]


@pytest.mark.parametrize(("authority", "addrs"), EQUIVALENCE)
@pytest.mark.parametrize("front", [HTTP, CONNECT], ids=["http", "connect"])
def test_fast_and_slow_drivers_write_the_same_record(
    front: Front, authority: str, addrs: tuple[IPAddress, ...]
) -> None:
    """The callback driver (a resolver cache hit: `resolved` in the same call as `start`, a
    pooled upstream already there) and the coroutine driver (the lookup awaited, other
    exchanges' events in between) give the same actions and the same audit line."""
    g = make_gate()

    def drive(interleave: bool) -> tuple[list[object], dict[str, object]]:
        if front is HTTP:
            it = request_intent(g, f"http://{authority}/p")
        else:
            it = intent(g, authority)
        x = Exchange(g, front)
        actions: list[object] = [x.start(it)]
        if interleave:  # another exchange runs while this one waits for its lookup
            other = Exchange(g, front)
            other.start(intent(g, "y.test:443"))
        if isinstance(actions[-1], Resolve):
            actions.append(x.resolved(addrs))
        if isinstance(actions[-1], Dial):
            actions.append(x.dialed(WORLD))
            if front is HTTP:
                actions.append(x.response(200))
            else:
                actions.append(x.replied())
                if isinstance(actions[-1], ReadHello):
                    actions.append(x.hello(ClientHelloResult("tls", "x.test")))
            actions.append(x.ended(None if front is HTTP else "eof", 1, 2, now=1000))
        last = actions[-1]
        done = last.done if isinstance(last, Refuse) else last
        assert isinstance(done, Done)
        event = done.record.event(done.decision, done.reason, done.rule, done.detail, done.status)
        event.pop("duration_ms", None)
        return [_shape(a) for a in actions], event

    assert drive(False) == drive(True)


def _shape(action: object) -> object:
    if isinstance(action, Refuse):
        return ("refuse", action.verdict, action.answer)
    if isinstance(action, Done):
        return ("done", action.decision, action.reason, action.status)
    return action


def test_every_target_is_a_target() -> None:
    assert isinstance(make_gate().connect_target("x.test:443"), Target)


# -- a pooled upstream that closed unanswered: one retry (docs/proxy.md#upstream-pool) -----
def _relaying(method: str) -> Exchange:
    g = make_gate()
    x = Exchange(g, HTTP)
    parsed = g.request_target("http://x.test/a")
    assert not isinstance(parsed, Verdict)
    target, path, _ = parsed
    assert x.start(Intent("198.18.0.5", method, "http", "", 0, 0, target, who(g), path=path))
    assert x.resolved((WORLD, ipaddress.ip_address("198.18.7.11"))) == Dial(
        (WORLD, ipaddress.ip_address("198.18.7.11")), 80, pooled=True
    )
    assert x.dialed(WORLD) == Relay(request=True)
    assert x.state is State.SENDING
    return x


def _sent(method: str) -> Exchange:
    """A request whose head went upstream: its response is read next."""
    x = _relaying(method)
    x.sent()
    assert x.state is State.AWAITING
    return x


@pytest.mark.parametrize("method", ["GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"])
def test_an_idempotent_request_is_retried_once_at_the_checked_address(method: str) -> None:
    """Issue 32: the retry dials the address already checked (the one it was connected
    to), alone, fresh: no `Resolve`, no new verdict; once; the record says so."""
    x = _sent(method)
    assert x.retry(True) == Dial((WORLD,), 80, pooled=False)
    assert x.state is State.SENDING  # its head goes again, on the fresh upstream
    x.sent()
    assert x.retry(True) is None  # once
    assert x.state is State.AWAITING
    x.response(200)
    event = done_of_ended(x).record.event("allow", "allow_rule", "x.test", None, 200)
    assert event["retried"] == 1
    assert event["addr"] == str(WORLD)


@pytest.mark.parametrize(
    ("method", "bodiless"),
    [("POST", True), ("PATCH", True), ("CONNECT", True), ("get", True), ("PUT", False)],
)
def test_a_request_that_may_not_be_sent_twice_is_not_retried(method: str, bodiless: bool) -> None:
    x = _sent(method)
    assert x.retry(bodiless) is None
    x.response(502)
    assert "retried" not in done_of_ended(x).record.event("allow", "allow_rule", "x.test")


def test_a_retry_outside_a_relay_is_a_sequence_error() -> None:
    assert set(TRANSITIONS["retry"]) == {State.AWAITING}
    with pytest.raises(SequenceError):
        Exchange(make_gate(), HTTP).retry(True)
    with pytest.raises(SequenceError):
        _relaying("GET").retry(True)  # its head not sent yet


# -- the request's head and response, events of the same machine (issue 33 item 2) ----------
def test_a_request_waits_for_its_head_to_be_sent_before_any_response() -> None:
    """After the dial a request's exchange waits for `sent`: a response head before it is a
    driver bug, as is a second `sent` without a `retry`."""
    x = _relaying("GET")
    with pytest.raises(SequenceError):
        x.response(200)
    x.sent()
    with pytest.raises(SequenceError):
        x.sent()
    assert x.response(100) == Relay(request=True)  # interim: still awaiting
    assert x.state is State.AWAITING
    assert x.response(200) == Relay(request=True)  # final: its body is relayed
    assert x.state is State.RELAYING
    with pytest.raises(SequenceError):
        x.response(200)  # one final head
    with pytest.raises(SequenceError):
        x.retry(True)  # a response came: not sent again
    done = x.ended(None, 3, 5)
    assert (done.status, done.record.bytes_up, done.record.bytes_down) == (200, 3, 5)


@pytest.mark.parametrize("state", sorted(State))
def test_the_inline_sent_check_is_the_tables(state: State) -> None:
    """`sent` checks its state inline (a call fewer per request): exactly the table's."""
    x = _relaying("GET")
    x.state = state
    if state in TRANSITIONS["sent"]:
        x.sent()
        assert x.state in TRANSITIONS["sent"][state]
    else:
        with pytest.raises(SequenceError):
            x.sent()


@pytest.mark.parametrize("state", [State.SENDING, State.AWAITING, State.RELAYING])
def test_a_request_cut_before_its_response_ends_from_any_of_its_states(state: State) -> None:
    """The proxy cuts a request (a policy change, a stop) or its client goes away before
    its head went, before its response or inside its body: its record ends from there."""
    x = _relaying("GET")
    if state is not State.SENDING:
        x.sent()
    if state is State.RELAYING:
        x.response(204)
    done = x.ended("revoked", 0, 0)
    assert done.record.end == "revoked"
    assert x.state is State.DONE


def test_a_tunnel_is_never_sent_nor_answered() -> None:
    """A tunnel relays after its dial: `sent` and `response` are a request's alone."""
    g = make_gate()
    x = Exchange(g, CONNECT)
    x.start(intent(g))
    x.resolved((WORLD,))
    x.dialed(WORLD)
    x.replied()
    for event in (x.sent, lambda: x.response(200), lambda: x.retry(True)):
        with pytest.raises(SequenceError):
            event()


def done_of_ended(x: Exchange) -> Done:
    return x.ended(None, 0, 0)

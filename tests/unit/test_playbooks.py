"""Every mode, every stage, as one table: the handshake through the mode's pure front-end, the
exchange played against a scripted world, the answer and the record checked. No sockets.

Rows are the stages an exchange can end at (mitmproxy's `tutils.Playbook` idea, written as
data): what the world does (the lookup, the dial, the ClientHello, the upstream's status) and
what the client asked. Columns are the six listener modes (HTTP forward, CONNECT, framework
forwarder, SOCKS5, transparent tunnels and their port-80 requests, DNS). Each cell is the
expected outcome, written out (not read back from the mode's table), or `NA` where the stage
cannot happen in that mode (a forwarder has no policy; a transparent or DNS client is its
listener's). The intents come from the modes' own front-ends where those are pure: the
SOCKS5 `Handshake` fed the client's bytes, the transparent `tls_target`/`tunnel_intent`, the
DNS `read_query`/`query_intent`/`play`/`render`.

The last test is HTTP/2's place (docs/architecture.md#one-exchange): two exchanges interleaved
on one connection, each with its own record, as an HTTP/2 front-end would drive its streams.
"""

from __future__ import annotations

import base64
import ipaddress
from dataclasses import dataclass, field
from typing import Any

import dns.message
import pytest
from playbook import Playbook, ev

from egress.config import ClientSpec, Settings
from egress.policy.addrs import AddressGuard
from egress.policy.rules import Policy
from egress.proxy.codec import socks5 as socks5_codec
from egress.proxy.codec.dns import FakeIPs, read_query
from egress.proxy.codec.tls_hello import MALFORMED, ClientHelloResult
from egress.proxy.core.actions import Dial, Done, ReadHello, Refuse, Relay, ReplyOk, Resolve
from egress.proxy.core.clients import ClientTable, Identity
from egress.proxy.core.exchange import Exchange, State
from egress.proxy.core.gate import Gate, Verdict
from egress.proxy.core.intent import CLOSE, RESET, Answer, Front, Intent
from egress.proxy.modes.dns import play, query_intent, render
from egress.proxy.modes.kinds import (
    CONNECT,
    DNS,
    FORWARDER,
    HTTP,
    SOCKS5,
    TRANSPARENT,
    TRANSPARENT_HTTP,
)
from egress.proxy.modes.socks5 import Handshake
from egress.proxy.modes.transparent import (
    absolute_form,
    kind_of,
    tls_target,
    tunnel_intent,
    tunnel_target,
)
from egress.proxy.net.resolve import ResolveError
from egress.reasons import End, Reason

WORLD = ipaddress.ip_address("198.18.7.10")
LOOP = ipaddress.ip_address("127.0.0.1")
FAKE = ipaddress.ip_address("198.19.128.1")
CLIENT = "198.18.0.5"
PEER = (CLIENT, 40000)
TOKEN = "s3cret"
POLICY = Policy(allow=["x.test", "route.test"])
NA = None  # the stage cannot happen in this mode


def make_gate(policy: Policy = POLICY) -> Gate:
    spec = ClientSpec("task-1", policy, token=TOKEN)
    table = ClientTable(Settings(policy, clients=(spec,)), require_auth=True)
    return Gate(table, AddressGuard())  # type: ignore[arg-type]


def basic(secret: str) -> str:
    return "Basic " + base64.b64encode(f"task-1:{secret}".encode()).decode()


# -- the world and the client, per stage ----------------------------------------------------------
@dataclass(frozen=True)
class Stage:
    """What the client asked and what the world did."""

    host: str = "x.test"
    port: int = 443  # requests use 80 for the same row
    secret: str = TOKEN
    audit_ok: bool = True
    malformed: bool = False  # a target that cannot be a target
    lookup: tuple[Any, ...] | BaseException = (WORLD,)
    dial: Any = WORLD  # the address that answered, or the error
    hello: ClientHelloResult | None = field(
        default_factory=lambda: ClientHelloResult("tls", "x.test")
    )
    status: int = 200  # the upstream's response to a request
    pool_full: bool = False  # DNS: the sandbox's fake-address pool


@dataclass(frozen=True)
class Outcome:
    """A cell: how the exchange ended (`answer` None: it was admitted and ended `Done`)."""

    reason: Reason
    answer: Answer | None = None
    status: int | None = None  # the record's status
    extra: tuple[tuple[str, object], ...] = ()  # record fields (`socks_reply`, `end`...)


def http(status: int, reason: Reason) -> Outcome:
    return Outcome(reason, Answer("http", status), status)


def socks(code: int, reason: Reason) -> Outcome:
    return Outcome(reason, Answer("socks5", code), None, (("socks_reply", code),))


def reset(reason: Reason) -> Outcome:
    return Outcome(reason, RESET, None, (("end", "reset"),))


def rcode(code: int, reason: Reason) -> Outcome:
    return Outcome(reason, Answer("dns", code), None)


R = Reason
OK_REQUEST = Outcome(R.ALLOW_RULE, None, 200)
MODES = ["http", "connect", "forwarder", "socks5", "transparent", "transparent-http", "dns"]
STAGES: dict[str, tuple[Stage, dict[str, Outcome | None]]] = {
    "success": (
        Stage(),
        {
            "http": OK_REQUEST,
            "connect": Outcome(R.ALLOW_RULE, None, 200, (("sni", "x.test"),)),
            "forwarder": Outcome(R.FRAMEWORK_ROUTE, None, 200),
            "socks5": Outcome(R.ALLOW_RULE, None, None, (("socks_reply", 0),)),
            "transparent": Outcome(R.ALLOW_RULE, None, None, (("sni", "x.test"),)),
            "transparent-http": OK_REQUEST,
            "dns": Outcome(R.ALLOW_RULE, None, None, (("answer", str(FAKE)), ("rcode", 0))),
        },
    ),
    "target": (
        Stage(host="a b.test", malformed=True, hello=None),
        {
            "http": http(400, R.BAD_REQUEST),
            "connect": http(400, R.BAD_REQUEST),
            "forwarder": NA,
            "socks5": socks(1, R.BAD_REQUEST),
            "transparent": reset(R.BAD_REQUEST),
            # a Host that cannot be a host is refused before any exchange (a connection record)
            "transparent-http": NA,
            "dns": rcode(3, R.BAD_REQUEST),  # a name that is no name: NXDOMAIN
        },
    ),
    "identity": (
        Stage(secret="nope"),
        {
            "http": http(407, R.AUTH_FAILED),
            "connect": http(407, R.AUTH_FAILED),
            "forwarder": NA,
            "socks5": Outcome(R.AUTH_FAILED, CLOSE),  # answered in RFC 1929, no RFC 1928 reply
            "transparent": NA,
            "transparent-http": NA,
            "dns": NA,
        },
    ),
    "audit": (
        Stage(audit_ok=False),
        {
            "http": http(503, R.AUDIT_UNAVAILABLE),
            "connect": http(503, R.AUDIT_UNAVAILABLE),
            "forwarder": Outcome(R.AUDIT_UNAVAILABLE, CLOSE),
            "socks5": socks(1, R.AUDIT_UNAVAILABLE),
            "transparent": NA,  # refused at accept (a connection record)
            "transparent-http": http(503, R.AUDIT_UNAVAILABLE),
            "dns": rcode(5, R.AUDIT_UNAVAILABLE),
        },
    ),
    "policy": (
        Stage(host="y.test", hello=ClientHelloResult("tls", "y.test")),
        {
            "http": http(403, R.DEFAULT_DENY),
            "connect": http(403, R.DEFAULT_DENY),
            "forwarder": NA,
            "socks5": socks(2, R.DEFAULT_DENY),
            "transparent": reset(R.DEFAULT_DENY),
            "transparent-http": http(403, R.DEFAULT_DENY),
            "dns": rcode(3, R.DEFAULT_DENY),
        },
    ),
    "port": (
        Stage(port=22, hello=None),
        {
            "http": http(403, R.PORT_NOT_ALLOWED),
            "connect": http(403, R.PORT_NOT_ALLOWED),
            "forwarder": NA,
            "socks5": socks(2, R.PORT_NOT_ALLOWED),
            "transparent": reset(R.PORT_NOT_ALLOWED),
            "transparent-http": NA,  # always port 80
            "dns": NA,  # a name is answered for every port
        },
    ),
    "resolve": (
        Stage(lookup=ResolveError("no such name"), pool_full=True),
        {
            "http": http(502, R.DNS_ERROR),
            "connect": http(502, R.DNS_ERROR),
            "forwarder": Outcome(R.DNS_ERROR, CLOSE),
            "socks5": socks(4, R.DNS_ERROR),
            "transparent": reset(R.DNS_ERROR),
            "transparent-http": http(502, R.DNS_ERROR),
            "dns": rcode(2, R.POOL_EXHAUSTED),  # its lookup is the pool
        },
    ),
    "resolve timeout": (
        Stage(lookup=TimeoutError()),
        {
            "http": http(504, R.DNS_TIMEOUT),
            "connect": http(504, R.DNS_TIMEOUT),
            "forwarder": Outcome(R.DNS_TIMEOUT, CLOSE),
            "socks5": socks(1, R.DNS_TIMEOUT),
            "transparent": reset(R.DNS_TIMEOUT),
            "transparent-http": http(504, R.DNS_TIMEOUT),
            "dns": NA,
        },
    ),
    "address": (
        Stage(lookup=(LOOP,)),
        {
            "http": http(403, R.RESERVED_ADDRESS),
            "connect": http(403, R.RESERVED_ADDRESS),
            "forwarder": NA,  # a framework route is not guarded
            "socks5": socks(2, R.RESERVED_ADDRESS),
            "transparent": reset(R.RESERVED_ADDRESS),
            "transparent-http": http(403, R.RESERVED_ADDRESS),
            "dns": NA,
        },
    ),
    "dial": (
        Stage(dial=ConnectionRefusedError()),
        {
            "http": http(502, R.CONNECTION_REFUSED),
            "connect": http(502, R.CONNECTION_REFUSED),
            "forwarder": Outcome(R.CONNECTION_REFUSED, CLOSE),
            "socks5": socks(5, R.CONNECTION_REFUSED),
            "transparent": reset(R.CONNECTION_REFUSED),
            "transparent-http": http(502, R.CONNECTION_REFUSED),
            "dns": NA,
        },
    ),
    "dial timeout": (
        Stage(dial=TimeoutError()),
        {
            "http": http(504, R.CONNECTION_TIMEOUT),
            "connect": http(504, R.CONNECTION_TIMEOUT),
            "forwarder": Outcome(R.CONNECTION_TIMEOUT, CLOSE),
            "socks5": socks(4, R.CONNECTION_TIMEOUT),
            "transparent": reset(R.CONNECTION_TIMEOUT),
            "transparent-http": http(504, R.CONNECTION_TIMEOUT),
            "dns": NA,
        },
    ),
    "sni": (
        Stage(hello=MALFORMED),
        {
            "http": NA,
            "connect": Outcome(R.SNI_MISMATCH, CLOSE, 200),  # after its 200: closed
            "forwarder": NA,
            "socks5": Outcome(R.SNI_MISMATCH, CLOSE, None, (("socks_reply", 0),)),
            "transparent": reset(R.SNI_MISMATCH),  # read before deciding
            "transparent-http": NA,
            "dns": NA,
        },
    ),
    "upstream 101": (
        Stage(status=101),
        {
            "http": http(502, R.UPSTREAM_ERROR),
            "connect": NA,
            "forwarder": NA,
            "socks5": NA,
            "transparent": NA,
            "transparent-http": http(502, R.UPSTREAM_ERROR),
            "dns": NA,
        },
    ),
}


# -- each mode's front-end: the client's side of a stage as an Intent ---------------------------
def http_intent(g: Gate, stage: Stage, *, transparent: bool = False) -> Intent:
    path = "/p"
    identity: Identity | Verdict
    if transparent:  # origin-form, made absolute from Host as the transparent front-end does
        url = absolute_form(path, stage.host, str(WORLD), 80)
        assert url is not None
        identity = Identity("task-1", POLICY)  # its listener's
    else:
        url = (
            "/origin-form" if stage.malformed else f"http://{stage.host}:{_http_port(stage)}{path}"
        )
        identity = g.identify_credential(None, PEER, basic(stage.secret))
    parsed = g.request_target(url)
    if isinstance(parsed, Verdict):
        return Intent(CLIENT, "GET", "http", "", 0, 0, parsed, None, audit_ok=stage.audit_ok)
    target, path, _ = parsed
    return Intent(
        CLIENT, "GET", "http", "", 0, 0, target, identity, path=path, audit_ok=stage.audit_ok
    )


def _http_port(stage: Stage) -> int:
    return 80 if stage.port == 443 else stage.port


def connect_intent(g: Gate, stage: Stage) -> Intent:
    authority = "x.test:99999" if stage.malformed else f"{stage.host}:{stage.port}"
    target = g.connect_target(authority)
    identity = None
    if not isinstance(target, Verdict):
        identity = g.identify_credential(None, PEER, basic(stage.secret))
    host, _, port = authority.rpartition(":")
    return Intent(
        CLIENT, "CONNECT", "https", host, int(port), 0, target, identity, audit_ok=stage.audit_ok
    )


def socks5_intent(g: Gate, stage: Stage) -> Intent:
    """The client's bytes through the pure handshake, as the SOCKS5 listener feeds them."""
    secret = stage.secret.encode()
    creds = bytes((1, 6)) + b"task-1" + bytes((len(secret),)) + secret
    data = bytes((5, 1, socks5_codec.METHOD_USERPASS)) + creds
    data += socks5_codec.serialize_request(stage.host, stage.port)
    shake = Handshake(g, CLIENT, PEER, None, 0, cap=lambda found: None)
    used, answer = shake.receive(data, audit_ok=stage.audit_ok)
    assert shake.intent is not None
    ok = stage.secret == TOKEN
    assert answer[:2] == bytes((5, socks5_codec.METHOD_USERPASS))
    assert answer[2:] == socks5_codec.auth_reply(ok)
    assert used == (
        len(data) if ok else len(data) - len(socks5_codec.serialize_request(stage.host, stage.port))
    )
    return shake.intent


def transparent_intent(stage: Stage) -> Intent:
    """A redirected connection to `port` of a fake address the responder gave `host`."""
    identity = Identity("task-1", POLICY)
    if kind_of(stage.port, POLICY.https_ports) == "tls":
        target = tls_target(stage.hello, stage.host, stage.port)
        where = f"{FAKE}:{stage.port}"
        return tunnel_intent(
            CLIENT,
            where,
            stage.host,
            stage.port,
            target,
            identity,
            hello=stage.hello,
            hello_first=True,
            t0=0,
        )
    target = tunnel_target(stage.host, stage.port)
    return tunnel_intent(
        CLIENT, f"{FAKE}:{stage.port}", stage.host, stage.port, target, identity, t0=0
    )


def forwarder_intent(stage: Stage) -> Intent:
    bound = Identity("task-1", POLICY)
    return Intent(
        CLIENT, "FORWARD", "tcp", "route.test", 8080, 0, None, bound, audit_ok=stage.audit_ok
    )


FRONTS: dict[str, Front] = {
    "http": HTTP,
    "connect": CONNECT,
    "forwarder": FORWARDER,
    "socks5": SOCKS5,
    "transparent": TRANSPARENT,
    "transparent-http": TRANSPARENT_HTTP,
    "dns": DNS,
}


def intent_for(mode: str, g: Gate, stage: Stage) -> Intent:
    if mode == "http":
        return http_intent(g, stage)
    if mode == "transparent-http":
        return http_intent(g, stage, transparent=True)
    if mode == "connect":
        return connect_intent(g, stage)
    if mode == "socks5":
        return socks5_intent(g, stage)
    if mode == "transparent":
        return transparent_intent(stage)
    return forwarder_intent(stage)


# -- a scripted world: each action answered as the stage says ------------------------------------
def run(x: Exchange, first: object, stage: Stage) -> list[object]:
    """Play the exchange to its end, answering each action as the stage's world would."""
    actions = [first]
    action = first
    while not isinstance(action, (Refuse, Done)):
        if isinstance(action, Resolve):
            lookup = stage.lookup
            action = (
                x.resolve_failed(lookup)
                if isinstance(lookup, BaseException)
                else x.resolved(lookup)
            )
        elif isinstance(action, Dial):
            dial = stage.dial
            action = (
                x.dial_failed(dial, action.addrs[0])
                if isinstance(dial, BaseException)
                else x.dialed(dial)
            )
        elif isinstance(action, ReplyOk):
            action = x.replied()
        elif isinstance(action, ReadHello):
            action = x.hello(stage.hello)
        elif isinstance(action, Relay) and action.request and x.record.status is None:
            if x.state is State.SENDING:
                x.sent()  # its head went upstream: its response is read next
            action = x.response(stage.status)
        else:
            action = x.ended(
                None if isinstance(action, Relay) and action.request else End.EOF.value, 1, 2
            )
        actions.append(action)
    return actions


def dns_run(g: Gate, stage: Stage) -> tuple[Refuse | Done, bytes | None]:
    """DNS: the query's bytes through the codec and the front-end, the exchange played at once."""
    name = "a b.test" if stage.malformed else stage.host
    query = read_query(dns.message.make_query(name, "A").to_wire())
    pool = FakeIPs("198.19.128.0/30")
    if stage.pool_full:
        pool.address_for("one.test")
        pool.address_for("two.test")
    intent = query_intent(
        query, CLIENT, Identity("task-1", POLICY), "udp", audit_ok=stage.audit_ok, t0=0
    )
    action = play(Exchange(g, DNS), intent, pool)
    return action, render(query, action)


CELLS = [
    (stage, mode)
    for stage, (_, expected) in STAGES.items()
    for mode in MODES
    if expected[mode] is not NA
]


@pytest.mark.parametrize(("stage_name", "mode"), CELLS, ids=[f"{s}-{m}" for s, m in CELLS])
def test_mode_stage_matrix(stage_name: str, mode: str) -> None:
    stage, expected_by_mode = STAGES[stage_name]
    expected = expected_by_mode[mode]
    assert expected is not None
    g = make_gate()
    x = Exchange(g, FRONTS[mode])
    if mode == "dns":
        last, wire = dns_run(g, stage)
        answer = dns.message.from_wire(wire) if wire is not None else None
        code = expected.answer.code if expected.answer is not None else 0
        assert answer is not None
        assert answer.rcode() == code
    else:
        actions = run(x, x.start(intent_for(mode, g, stage)), stage)
        last = actions[-1]
        assert x.state is State.DONE
    done = last.done if isinstance(last, Refuse) else last
    assert isinstance(done, Done)
    if expected.answer is None:
        assert isinstance(last, Done), last
        assert done.decision == "allow"
    else:
        assert isinstance(last, Refuse), last
        assert last.answer == expected.answer
    assert done.reason == expected.reason.value
    assert done.status == expected.status
    rec = done.record
    for name, value in expected.extra:
        assert getattr(rec, name) == value, name
    assert rec.mode == FRONTS[mode].record_mode
    event = rec.event(done.decision, done.reason, done.rule, done.detail, done.status)
    assert event["reason"] == expected.reason.value


def test_the_matrix_names_every_mode_at_every_stage() -> None:
    """No blank cell: each stage says, for each mode, its outcome or that it cannot happen;
    and every mode has its success and at least three refusal stages."""
    for stage, (_, expected) in STAGES.items():
        assert set(expected) == set(MODES), stage
    for mode in MODES:
        cells = [s for s, (_, e) in STAGES.items() if e[mode] is not NA]
        assert "success" in cells
        assert len(cells) >= 4, mode


def test_socks5_handshake_stages_without_a_socket() -> None:
    """The pure handshake, byte by byte: the method answered at once, the credentials next,
    then the request; a refusal before the request has no RFC 1928 reply to give."""
    g = make_gate()
    shake = Handshake(g, CLIENT, PEER, None, 0, cap=lambda found: None)
    assert shake.receive(b"\x05") == (0, b"")  # not a whole greeting yet
    assert shake.receive(b"\x05\x01\x02") == (3, b"\x05\x02")
    assert shake.intent is None
    creds = b"\x01\x06task-1\x06" + TOKEN.encode()
    assert shake.receive(creds[:-1]) == (0, b"")
    assert shake.receive(creds) == (len(creds), b"\x01\x00")
    request = socks5_codec.serialize_request("x.test", 443)
    used, out = shake.receive(request + b"\x16\x03\x01")  # a ClientHello already behind it
    assert (used, out) == (len(request), b"")
    assert shake.requested
    intent = shake.intent
    assert intent is not None
    assert (intent.host, intent.port, intent.answerable) == ("x.test", 443, True)

    # no acceptable method: answered 0xFF, refused as auth_required, nothing more read
    shake = Handshake(g, CLIENT, PEER, None, 0, cap=lambda found: None)
    assert shake.receive(b"\x05\x01\x00") == (3, b"\x05\xff")
    assert shake.intent is not None
    assert isinstance(shake.intent.identity, Verdict)
    assert shake.intent.identity.reason is Reason.AUTH_REQUIRED
    assert not shake.requested

    # the per-client cap refuses an identified client: RFC 1929 failure, the cap's refusal
    cap = Verdict(Reason.TOO_MANY_CONNECTIONS, "per-client connection limit reached")
    shake = Handshake(g, CLIENT, PEER, None, 0, cap=lambda found: cap)
    assert shake.receive(b"\x05\x01\x02" + creds) == (3 + len(creds), b"\x05\x02\x01\x01")
    assert shake.intent is not None
    assert shake.intent.cap is cap

    # a malformed greeting: refused, closed without a reply (there is none to send)
    shake = Handshake(g, CLIENT, PEER, None, 0, cap=lambda found: None)
    assert shake.receive(b"\x04\x01\x00") == (0, b"")
    assert shake.intent is not None
    assert not shake.intent.answerable
    x = Exchange(g, SOCKS5)
    refused = x.start(shake.intent)
    assert isinstance(refused, Refuse)
    assert refused.answer == CLOSE


def test_socks5_bound_listener_needs_no_credentials() -> None:
    g = make_gate()
    bound = Identity("task-1", POLICY)
    shake = Handshake(g, CLIENT, PEER, bound, 0, cap=lambda found: None)
    data = b"\x05\x01\x00" + socks5_codec.serialize_request("x.test", 443)
    assert shake.receive(data) == (len(data), b"\x05\x00")
    assert shake.intent is not None
    assert shake.intent.identity is bound


@pytest.mark.parametrize(
    ("port", "kind"), [(80, "http"), (443, "tls"), (8443, "tls"), (22, "raw"), (8080, "raw")]
)
def test_transparent_port_decides_how_it_is_served(port: int, kind: str) -> None:
    assert kind_of(port, frozenset({8443})) == kind


# -- HTTP/2's place ------------------------------------------------------------------------------
class Connection:
    """What an HTTP/2 front-end would hold per client connection: the client, its identity
    (identified once, for the connection) and one `Exchange` per stream. Nothing in the core
    ties an exchange to a connection, so two streams run interleaved on one connection."""

    def __init__(self, gate: Gate, identity: Identity | Verdict) -> None:
        self.gate = gate
        self.identity = identity
        self.streams: dict[int, Exchange] = {}

    def request(self, stream: int, url: str) -> object:
        parsed = self.gate.request_target(url)
        assert not isinstance(parsed, Verdict)
        target, path, _ = parsed
        x = self.streams[stream] = Exchange(self.gate, HTTP)
        return x.start(Intent(CLIENT, "GET", "http", "", 0, 0, target, self.identity, path=path))


def test_two_exchanges_interleaved_on_one_connection() -> None:
    """Streams 1 and 3 on one connection: each event goes to its stream's exchange, in an
    order no HTTP/1.1 connection could produce (stream 3 answered and ended while stream 1
    still waits for its lookup); each record is its own and equals the one the same events
    give on a connection of its own."""
    g = make_gate()
    conn = Connection(g, g.identify_credential(None, PEER, basic(TOKEN)))
    one, three = 1, 3
    assert conn.request(one, "http://x.test/slow") == Resolve("x.test")
    assert conn.request(three, "http://route.test/fast") == Resolve("route.test")
    s1, s3 = conn.streams[one], conn.streams[three]
    interleaved = (
        Playbook(s3)
        >> ev.resolved((WORLD,))
        << Dial((WORLD,), 80, pooled=True)
        >> ev.dialed(WORLD)
        << Relay(request=True)
        >> ev.sent()
        << None
        >> ev.response(204)
        << Relay(request=True)
    )
    assert interleaved
    assert s1.state is State.RESOLVING  # stream 1 untouched by stream 3's events
    assert (
        Playbook(s1)
        >> ev.resolved((WORLD,))
        << Dial((WORLD,), 80, pooled=True)
        >> ev.dialed(WORLD)
        << Relay(request=True)
    )
    end3 = s3.ended(None, 10, 20, now=1000)
    assert s1.record.status is None  # stream 3's answer did not leak into stream 1
    s1.sent()
    assert s1.response(200) == Relay(request=True)
    end1 = s1.ended(None, 30, 40, now=2000)
    first = end1.record.event("allow", end1.reason, end1.rule, None, end1.status)
    second = end3.record.event("allow", end3.reason, end3.rule, None, end3.status)
    assert (first["host"], first["path"], first["status"], first["bytes_down"]) == (
        "x.test",
        "/slow",
        200,
        40,
    )
    assert (second["host"], second["path"], second["status"], second["bytes_down"]) == (
        "route.test",
        "/fast",
        204,
        20,
    )

    # the same events on a connection of its own give the same record
    alone = Connection(g, conn.identity)
    alone.request(one, "http://x.test/slow")
    x = alone.streams[one]
    x.resolved((WORLD,))
    x.dialed(WORLD)
    x.sent()
    x.response(200)
    solo = x.ended(None, 30, 40, now=2000)
    assert solo.record.event("allow", solo.reason, solo.rule, None, solo.status) == first

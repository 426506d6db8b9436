"""The gate, as playbooks: (situation -> Admit | Verdict(reason)) tables, no root, no sockets.

Every `Reason` must be produced by at least one row (`test_every_reason_is_covered`), so a
new reason cannot be added without saying here how the gate reaches it. The verdict cache
tests prove that no decision path (name, IP literal, framework route, SNI) can serve one
policy's verdict to another, even after the first policy is freed and its `id()` reused.
"""

from __future__ import annotations

import base64
import gc
import ipaddress
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from egress.config import ClientSpec, Settings
from egress.errors import ProtocolError
from egress.policy.addrs import AddressGuard
from egress.policy.rules import Policy
from egress.policy.target import IPAddress, Target, parse_authority
from egress.proxy.codec.http1 import RequestHead, parse_request_head
from egress.proxy.codec.tls_hello import MALFORMED, NOT_TLS, ClientHelloResult
from egress.proxy.core.clients import ClientTable, Identity
from egress.proxy.core.gate import (
    HEAD_TIMEOUT,
    Admit,
    Gate,
    Verdict,
    admit_client,
    admit_connection,
    keep_alive_after,
    refuse_dial,
    refuse_head,
    refuse_resolve,
    response_step,
)
from egress.proxy.net.resolve import ResolveError
from egress.reasons import End, Reason

WORLD = ipaddress.ip_address("198.18.7.10")
LOOP = ipaddress.ip_address("127.0.0.1")
PEER = ("198.18.0.5", 40000)


def gate(
    policy: Policy | None = None,
    *,
    clients: tuple[ClientSpec, ...] = (),
    require_auth: bool = False,
    sni_missing: str = "if-named",
) -> Gate:
    settings = Settings(policy or Policy(), clients=clients)
    table = ClientTable(settings, require_auth=require_auth)
    return Gate(table, AddressGuard(), sni_missing)  # type: ignore[arg-type]


def verdict(
    policy: Policy, authority: str, addrs: tuple[IPAddress, ...] = (), scheme: str = "https"
) -> Admit | Verdict:
    """What the server does with a target: decide, refuse early, else admit on `addrs`."""
    g = gate(policy)
    if scheme == "https":
        target = g.connect_target(authority)
    else:
        parsed = g.request_target(f"http://{authority}/")
        target = parsed if isinstance(parsed, Verdict) else parsed[0]
    if isinstance(target, Verdict):
        return target
    first = g.decide(policy, target)
    early = g.refuse_early(first)
    if early is not None:
        return early
    return g.admit(policy, target, first, addrs or ((target.ip,) if target.ip else (WORLD,)))


def sni(
    hello: ClientHelloResult | None,
    policy: Policy,
    authority: str = "x.test:443",
    mode: str = "if-named",
) -> Admit | Verdict:
    g = gate(policy, sni_missing=mode)
    target = parse_authority(authority)
    first = g.admit(policy, target, g.decide(policy, target), (WORLD,))
    assert isinstance(first, Admit)
    return g.sni(policy, target, first, hello)


def head(authorization: str | None = None) -> RequestHead:
    """A real parsed request head, with `Proxy-Authorization: authorization` if given."""
    fields = f"Proxy-Authorization: {authorization}\r\n" if authorization is not None else ""
    raw = f"GET http://x.test/ HTTP/1.1\r\nHost: x.test\r\n{fields}\r\n".encode("latin-1")
    parsed = parse_request_head(raw)
    assert parsed is not None
    return parsed[0]


def auth(header: str | None, *, require: bool = False) -> Identity | Verdict:
    spec = ClientSpec("task-1", Policy(allow=["x.test"]), token="s3cret")
    return gate(clients=(spec,), require_auth=require).identify(None, PEER, head(header))


def basic(text: str) -> str:
    return "Basic " + base64.b64encode(text.encode()).decode()


@dataclass(frozen=True)
class Row:
    name: str
    play: Callable[[], object]
    expect: Reason


ALLOW_X = Policy(allow=["x.test"])
ROWS = [
    # -- policy verdicts (docs/policy.md#precedence-and-reason-codes)
    Row("allow rule", lambda: verdict(ALLOW_X, "x.test:443"), Reason.ALLOW_RULE),
    Row(
        "default allow",
        lambda: verdict(Policy(default="allow"), "y.test:443"),
        Reason.DEFAULT_ALLOW,
    ),
    Row(
        "framework route skips the guard",
        lambda: verdict(Policy(framework_routes=["http://127.0.0.1:8080"]), "127.0.0.1:8080"),
        Reason.FRAMEWORK_ROUTE,
    ),
    Row(
        "block rule",
        lambda: verdict(Policy(block=["x.test"], default="allow"), "x.test:443"),
        Reason.BLOCK_RULE,
    ),
    Row("default deny", lambda: verdict(Policy(), "y.test:443"), Reason.DEFAULT_DENY),
    Row("port not allowed", lambda: verdict(ALLOW_X, "x.test:22"), Reason.PORT_NOT_ALLOWED),
    Row(
        "name resolving to loopback",
        lambda: verdict(ALLOW_X, "x.test:443", (LOOP,)),
        Reason.RESERVED_ADDRESS,
    ),
    Row(
        "IP literal loopback",
        lambda: verdict(Policy(default="allow"), "127.0.0.1:443"),
        Reason.RESERVED_ADDRESS,
    ),
    # -- targets
    Row("bad CONNECT authority", lambda: verdict(ALLOW_X, "x.test:99999"), Reason.BAD_REQUEST),
    Row("origin-form", lambda: gate().request_target("/index.html"), Reason.BAD_REQUEST),
    Row(
        "https absolute form", lambda: gate().request_target("https://x.test/"), Reason.BAD_REQUEST
    ),
    Row(
        "ftp absolute form", lambda: gate().request_target("ftp://x.test/?k=1"), Reason.BAD_REQUEST
    ),
    Row("userinfo", lambda: gate().request_target("http://u:p@x.test/"), Reason.BAD_REQUEST),
    # -- heads
    Row("malformed head", lambda: refuse_head(ProtocolError("bad", 400)), Reason.BAD_REQUEST),
    Row("HTTP/2 head", lambda: refuse_head(ProtocolError("version", 505)), Reason.BAD_REQUEST),
    Row("head too large", lambda: refuse_head(ProtocolError("big", 431)), Reason.HEAD_TOO_LARGE),
    Row("head timeout", lambda: HEAD_TIMEOUT, Reason.HEAD_TIMEOUT),
    # -- identity (docs/proxy.md#clients-tokens-and-407)
    Row("no token, auth required", lambda: auth(None, require=True), Reason.AUTH_REQUIRED),
    Row("wrong token", lambda: auth(basic("task-1:nope")), Reason.AUTH_FAILED),
    Row("not Basic", lambda: auth("Bearer s3cret"), Reason.AUTH_FAILED),
    Row("not base64", lambda: auth("Basic !!!"), Reason.AUTH_FAILED),
    Row("non-ASCII credentials", lambda: auth("Basic \xe9"), Reason.AUTH_FAILED),
    Row(
        "non-UTF-8 credentials",
        lambda: auth("Basic " + base64.b64encode(b"\xff:\xfe").decode()),
        Reason.AUTH_FAILED,
    ),
    # -- resolution and dialing
    Row(
        "NXDOMAIN", lambda: refuse_resolve(ResolveError("no such name"), "x.test"), Reason.DNS_ERROR
    ),
    Row("DNS timeout", lambda: refuse_resolve(TimeoutError(), "x.test"), Reason.DNS_TIMEOUT),
    Row(
        "refused",
        lambda: refuse_dial(ConnectionRefusedError(), WORLD, 80),
        Reason.CONNECTION_REFUSED,
    ),
    Row(
        "connect timeout", lambda: refuse_dial(TimeoutError(), WORLD, 80), Reason.CONNECTION_TIMEOUT
    ),
    Row(
        "unreachable",
        lambda: refuse_dial(OSError(113, "No route to host"), WORLD, 80),
        Reason.UPSTREAM_ERROR,
    ),
    Row("101 from upstream", lambda: response_step(101), Reason.UPSTREAM_ERROR),
    # -- SNI (docs/proxy.md#tls-sni-check)
    Row(
        "SNI names a blocked host",
        lambda: sni(ClientHelloResult("tls", "evil.test"), ALLOW_X),
        Reason.SNI_MISMATCH,
    ),
    Row("malformed hello", lambda: sni(MALFORMED, ALLOW_X), Reason.SNI_MISMATCH),
    Row("invalid SNI", lambda: sni(ClientHelloResult("tls", "a..b"), ALLOW_X), Reason.SNI_MISMATCH),
    Row("not TLS, deny mode", lambda: sni(NOT_TLS, ALLOW_X, mode="deny"), Reason.SNI_MISSING),
    Row(
        "no hello on an IP literal",
        lambda: sni(None, Policy(allow=["198.18.7.10"]), "198.18.7.10:443"),
        Reason.SNI_MISSING,
    ),
    # -- connections
    Row(
        "global cap",
        lambda: admit_connection(5, 4, closing=False, audit_ok=True),
        Reason.TOO_MANY_CONNECTIONS,
    ),
    Row(
        "shutting down",
        lambda: admit_connection(1, 4, closing=True, audit_ok=True),
        Reason.TOO_MANY_CONNECTIONS,
    ),
    Row("per-client cap", lambda: admit_client(3, 2), Reason.TOO_MANY_CONNECTIONS),
    Row(
        "audit log down",
        lambda: admit_connection(1, 4, closing=False, audit_ok=False),
        Reason.AUDIT_UNAVAILABLE,
    ),
]


def outcome_reason(result: object) -> str:
    if isinstance(result, Verdict):
        return result.reason.value
    if isinstance(result, Admit):
        return result.reason
    raise AssertionError(f"not an outcome: {result!r}")


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_playbook(row: Row) -> None:
    result = row.play()
    assert outcome_reason(result) == row.expect
    if isinstance(result, Verdict):
        assert result.decision == row.expect.decision
        assert result.answer_status in (row.expect.status, 505)
        assert row.expect.value in repr(result)  # readable: the code is in the repr


# written by the sandbox lifecycle (boundary/sandboxes.py), not by the gate
LIFECYCLE = {
    Reason.SANDBOX_ADDED,
    Reason.SANDBOX_REPLACED,
    Reason.SANDBOX_REMOVED,
    Reason.LISTENER_PROBE,
}
# connection slots (admission.py; tests/unit/test_admission.py, test_connection_slots.py)
SLOTS = {Reason.IDENTIFY_TIMEOUT, Reason.EVICTED}


# written by the SOCKS5, DNS and transparent listeners' own parsers and shells (their tests:
# test_socks5.py, test_dnsanswer.py, tests/integration/test_transparent.py)
LISTENER_KINDS = {
    Reason.COMMAND_NOT_SUPPORTED,
    Reason.ADDRESS_TYPE_NOT_SUPPORTED,
    Reason.NOT_REDIRECTED,
    Reason.NOT_A_NAME,
    Reason.ADDRESS_RULES,
    Reason.POOL_EXHAUSTED,
}


def test_every_reason_is_covered() -> None:
    assert {r.expect for r in ROWS} | LIFECYCLE | LISTENER_KINDS | SLOTS == set(Reason)


@pytest.mark.parametrize(
    ("refusal", "bodiless", "keep_alive", "closing", "expect"),
    [
        (Verdict(Reason.DEFAULT_DENY, "d"), True, True, False, True),
        (Verdict(Reason.RESERVED_ADDRESS, "d"), True, True, False, True),
        (Verdict(Reason.DEFAULT_DENY, "d"), False, True, False, False),  # unread body
        (Verdict(Reason.DEFAULT_DENY, "d"), True, False, False, False),  # client said close
        (Verdict(Reason.DEFAULT_DENY, "d"), True, True, True, False),  # shutting down
        (Verdict(Reason.AUTH_FAILED, "d", status=407), True, True, False, False),
        (Verdict(Reason.BAD_REQUEST, "d", status=400), True, True, False, False),
        (Verdict(Reason.DNS_ERROR, "d"), True, True, False, False),
    ],
)
def test_keep_alive_after_refusal(
    refusal: Verdict, bodiless: bool, keep_alive: bool, closing: bool, expect: bool
) -> None:
    got = keep_alive_after(refusal, bodiless=bodiless, keep_alive=keep_alive, closing=closing)
    assert got is expect


@pytest.mark.parametrize(
    ("status", "step"),
    [
        (100, "interim"),
        (103, "interim"),
        (199, "interim"),
        (200, "final"),
        (204, "final"),
        (404, "final"),
    ],
)
def test_response_steps(status: int, step: str) -> None:
    assert response_step(status) == step


def test_identity_sources_tokens_and_bound_listener() -> None:
    a = ClientSpec("a", Policy(allow=["a.test"]), token="tok-a")
    b = ClientSpec("b", Policy(allow=["b.test"]), sources=(ipaddress.ip_network("198.18.0.0/24"),))
    g = gate(clients=(a, b))
    assert g.identify(None, PEER, head()) == Identity("b", b.policy)
    assert g.identify(None, PEER, head(basic("a:tok-a"))) == Identity("a", a.policy)
    assert g.identify(None, ("198.19.0.1", 1), head()).client_id is None  # type: ignore[union-attr]
    bound = Identity("c", Policy())
    assert g.identify(bound, PEER, head(basic("a:tok-a"))) is bound  # the listener wins
    assert g.identify(None, PEER, head("Basic \xe9")) == Verdict(
        Reason.AUTH_FAILED, "proxy credentials not accepted", status=407
    )


def test_sni_passes() -> None:
    assert sni(ClientHelloResult("tls", "x.test"), ALLOW_X) == Admit("allow_rule", "x.test")
    both = Policy(allow=["x.test", "y.test"])
    assert sni(ClientHelloResult("tls", "y.test"), both) == Admit("allow_rule", "x.test")
    assert sni(NOT_TLS, ALLOW_X) == Admit("allow_rule", "x.test")  # if-named: a named allow
    assert sni(None, ALLOW_X, mode="allow") == Admit("allow_rule", "x.test")


def test_wants_sni() -> None:
    routes = Policy(framework_routes=["http://127.0.0.1:443"], allow=["https://x.test:8443"])
    assert Gate.wants_sni(routes, parse_authority("x.test:443"))
    assert not Gate.wants_sni(routes, parse_authority("127.0.0.1:443"))
    assert Gate.wants_sni(routes, parse_authority("x.test:8443"))
    assert not Gate.wants_sni(routes, parse_authority("x.test:8080"))


def test_request_target_path_and_cache() -> None:
    g = gate()
    got = g.request_target("http://X.test:80/a?b#frag")
    assert not isinstance(got, Verdict)
    target, path, explicit = got
    assert (target.host, target.port, path, explicit) == ("x.test", 80, "/a?b", True)
    again = g.request_target("http://X.test:80")
    assert not isinstance(again, Verdict)
    assert again[0] is target
    assert again[1] == "/"


def test_reprs_are_readable() -> None:
    assert repr(Admit("allow_rule", "x.test")) == "Admit(allow_rule, rule='x.test')"
    assert repr(Verdict(Reason.BAD_REQUEST, "no", status=505)) == (
        "Verdict(bad_request, 'no', status=505)"
    )
    assert End.HELLO_TIMEOUT.text


# -- the verdict cache cannot cross policies (issue: id(policy) reuse after GC) --------------


def _decide_path(g: Gate, policy: Policy, authority: str) -> Admit | Verdict:
    target: Target = parse_authority(authority)
    first = g.decide(policy, target)
    early = g.refuse_early(first)
    if early is not None:
        return early
    addrs = (target.ip,) if target.ip is not None else (WORLD,)
    return g.admit(policy, target, first, addrs)


@pytest.mark.parametrize(
    ("allowing", "denying", "authority"),
    [
        # IP literal: admitted without a second judgement
        (lambda: Policy(allow=["198.18.7.10"]), lambda: Policy(), "198.18.7.10:443"),
        # framework route: exempt from the guard and from the second judgement
        (
            lambda: Policy(framework_routes=["http://127.0.0.1:8080"]),
            lambda: Policy(),
            "127.0.0.1:8080",
        ),
        # a name: judged again on its addresses, but the first verdict is cached too
        (lambda: Policy(allow=["x.test"]), lambda: Policy(), "x.test:443"),
    ],
    ids=["ip-literal", "framework-route", "name"],
)
def test_no_verdict_crosses_policies(
    allowing: Callable[[], Policy], denying: Callable[[], Policy], authority: str
) -> None:
    g = gate()
    reused = 0
    for i in range(200):
        allow = allowing()
        freed_id = id(allow)
        assert isinstance(_decide_path(g, allow, authority), Admit)
        del allow  # freed at once (no cycles); the next policy may reuse its id()
        if i % 50 == 0:
            gc.collect()  # and now and then with a full collection in between
        deny = denying()
        reused += id(deny) == freed_id
        assert isinstance(_decide_path(g, deny, authority), Verdict)
        del deny
    assert reused > 0, "the test must actually see a freed policy's id() reused"


def test_freed_policy_leaves_no_cache_entry() -> None:
    g = gate()
    policy = Policy(allow=["x.test"])
    g.decide(policy, parse_authority("x.test:443"))
    assert len(g._verdicts) == 1
    del policy
    gc.collect()
    assert len(g._verdicts) == 0


def test_guard_change_drops_verdicts() -> None:
    policy = Policy(allow=["198.18.7.10"])
    g = gate(policy)
    target = parse_authority("198.18.7.10:443")
    assert g.decide(policy, target).allowed
    g.set_guard(AddressGuard(host_local=frozenset({WORLD})))
    assert g.decide(policy, target).reason == "reserved_address"

"""The kept decision (egress/proxy/core/kept.py) without sockets: what it keeps and compares.

`Exchange.kept` takes the decision an exchange reached, and `Exchange.start_kept` starts the
next one from it: the record and the actions must be the ones the full sequence (start,
resolved, dialed) gives, for an IP literal, a name, an allow rule and report-only. `Kept.holds`
must miss when any part of its key is another object (docs/architecture.md#the-kept-decision).
The proxy's own use of it, on real sockets, is tests/integration/test_kept_decision.py.
"""

from __future__ import annotations

import dataclasses
import ipaddress

import pytest

from egress.config import ClientSpec, Settings
from egress.policy.addrs import AddressGuard
from egress.policy.rules import Policy
from egress.policy.target import IPAddress
from egress.proxy.core.actions import Dial, Relay
from egress.proxy.core.clients import ClientTable
from egress.proxy.core.exchange import Exchange, SequenceError, State
from egress.proxy.core.gate import Gate, Verdict
from egress.proxy.core.intent import Intent
from egress.proxy.core.kept import ANY_CREDENTIAL, Kept
from egress.proxy.modes.kinds import HTTP

WORLD = ipaddress.ip_address("198.18.7.10")
OTHER = ipaddress.ip_address("198.18.7.11")
OWNER = ("source", "198.18.0.5")


def make_gate(policy: Policy) -> Gate:
    table = ClientTable(Settings(policy, clients=(ClientSpec("box", policy, token="t"),)))
    return Gate(table, AddressGuard())


def judged(g: Gate, url: str, addrs: tuple[IPAddress, ...]) -> Exchange:
    """A request through the whole sequence, up to its relay on `addrs[0]`."""
    parsed = g.request_target(url)
    assert not isinstance(parsed, Verdict)
    target, path, _ = parsed
    identity = g.clients.identity("box")
    intent = Intent("198.18.0.5", "GET", "http", "", 0, 7, target, identity, path=path)
    x = Exchange(g, HTTP)
    step = x.start(intent)
    if target.ip is None:
        step = x.resolved(addrs)
    assert isinstance(step, Dial)
    assert isinstance(x.dialed(addrs[0]), Relay)
    return x


def keep(g: Gate, x: Exchange, resolved: tuple[IPAddress, ...] | None) -> Kept:
    kept = Kept.reached(
        x,
        authority=x.record.host,
        bound=None,
        clients=g.clients,
        credential="Basic dA==",
        guard=g.guard,
        owner=OWNER,
        resolved=resolved,
        explicit_port=False,
    )
    assert kept is not None
    return kept


def record_fields(x: Exchange) -> dict[str, object]:
    """The record's data attributes but `t0`, read through `dir` (a compiled `AccessRecord`
    has no `__slots__`: docs/architecture.md#a-compiled-build)."""
    rec = x.record
    names = [n for n in dir(rec) if not n.startswith("_") and not callable(getattr(rec, n))]
    assert "path" in names
    return {name: getattr(rec, name) for name in names if name != "t0"}


@pytest.mark.parametrize(
    ("policy", "url", "addrs"),
    [
        (Policy(allow=["198.18.7.10"]), "http://198.18.7.10/a?q=1", (WORLD,)),
        (Policy(allow=["x.test"]), "http://x.test/a", (WORLD, OTHER)),
        (Policy(allow=[], report_only=True), "http://x.test/b", (WORLD,)),
    ],
    ids=["ip", "name", "report-only"],
)
def test_a_kept_start_writes_the_record_the_full_sequence_writes(
    policy: Policy, url: str, addrs: tuple[IPAddress, ...]
) -> None:
    g = make_gate(policy)
    first = judged(g, url, addrs)
    name = first.record.host != str(WORLD)
    kept = keep(g, first, addrs if name else None)
    again = Exchange(g, HTTP)
    target = kept.target
    dial = again.start_kept("198.18.0.5", "GET", first.record.path or "/", 7, None, kept)
    assert dial == Dial(addrs, target.port, pooled=True)
    assert again.state is State.DIALING
    assert isinstance(again.dialed(addrs[0]), Relay)
    assert record_fields(again) == record_fields(first)
    assert (again.record.would is not None) is policy.report_only
    assert again.decided
    assert again.dialed_addr == addrs[0]


def test_only_an_exchange_admitted_and_dialed_is_kept() -> None:
    g = make_gate(Policy(allow=["x.test"]))
    key = {
        "bound": None,
        "clients": g.clients,
        "credential": ANY_CREDENTIAL,
        "guard": g.guard,
        "owner": OWNER,
        "resolved": (WORLD,),
        "explicit_port": False,
    }
    for url, state in (("http://y.test/", State.DONE), ("http://x.test/", State.RESOLVING)):
        target, path, _ = g.request_target(url)  # type: ignore[misc]
        identity = g.clients.identity("box")
        x = Exchange(g, HTTP)
        x.start(Intent("198.18.0.5", "GET", "http", "", 0, 0, target, identity, path=path))
        assert x.state is state  # refused (default deny), or not dialed yet
        assert Kept.reached(x, authority=target.host, **key) is None  # type: ignore[arg-type]


def test_a_kept_start_is_a_start() -> None:
    """`start_kept` is an event of the transition table: only on a new exchange."""
    g = make_gate(Policy(allow=["x.test"]))
    x = judged(g, "http://x.test/", (WORLD,))
    kept = keep(g, x, (WORLD,))
    with pytest.raises(SequenceError):
        x.start_kept("198.18.0.5", "GET", "/", 0, None, kept)


def test_holds_only_for_the_same_key() -> None:
    g = make_gate(Policy(allow=["x.test"]))
    kept = keep(g, judged(g, "http://x.test/", (WORLD,)), (WORLD,))
    same = ("x.test", None, g.clients, g.guard, OWNER)
    assert kept.holds(*same)
    other_table = ClientTable(Settings(Policy(allow=["x.test"])))
    changes = {
        "authority": ("x.test:8080", None, g.clients, g.guard, OWNER),
        "bound": ("x.test", g.clients.identity("box"), g.clients, g.guard, OWNER),
        "table": ("x.test", None, other_table, g.guard, OWNER),
        "guard": ("x.test", None, g.clients, dataclasses.replace(g.guard), OWNER),
        "owner": ("x.test", None, g.clients, g.guard, "box"),
    }
    for what, key in changes.items():
        assert not kept.holds(*key), what  # type: ignore[arg-type]
    g.clients.add(ClientSpec("another", Policy(), token="u"))  # a sandbox prepared
    assert not kept.holds(*same)

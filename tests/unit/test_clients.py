"""The client (sandbox) lifecycle in the pure table (core/clients.py): add, replace, remove.

A hypothesis state machine drives random sequences of add/replace/remove and requests
against a model of which policy must apply: a removed client's token and source addresses
identify nobody, a replaced policy applies from the next request, and no request is ever
identified as another client.
"""

from __future__ import annotations

import base64
import ipaddress
from dataclasses import dataclass

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from egress.config import ClientSpec, Settings
from egress.policy.rules import Policy
from egress.proxy.core.clients import AuthError, ClientError, ClientTable, Leases, admission_source

IDS = ["a", "b", "c", "d"]
TOKENS = ["t1", "t2", "t3", "t4", "t5"]
Net = ipaddress.IPv4Network | ipaddress.IPv6Network
NETS = [ipaddress.ip_network(f"198.18.{i}.0/24") for i in range(4)]


def basic(token: str) -> str:
    return "Basic " + base64.b64encode(f"x:{token}".encode()).decode()


@dataclass
class Entry:
    policy: Policy
    token: str | None
    sources: tuple[Net, ...]


class ClientMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.default = Policy()
        self.table = ClientTable(Settings(self.default))
        self.model: dict[str, Entry] = {}

    def _clash(
        self, cid: str, token: str | None, sources: tuple[ipaddress.IPv4Network, ...]
    ) -> bool:
        for other_id, other in self.model.items():
            if other_id == cid:
                continue
            if token is not None and token == other.token:
                return True
            if set(sources) & set(other.sources):
                return True
        return False

    @rule(
        cid=st.sampled_from(IDS),
        token=st.none() | st.sampled_from(TOKENS),
        net=st.none() | st.sampled_from(NETS),
        replace=st.booleans(),
    )
    def add(
        self, cid: str, token: str | None, net: ipaddress.IPv4Network | None, replace: bool
    ) -> None:
        if token is None and net is None:
            token = "t1"
        sources = () if net is None else (net,)
        policy = Policy(allow=[f"{cid}.test"])
        spec = ClientSpec(cid, policy, token, sources)
        refused = self._clash(cid, token, sources) or (cid in self.model and not replace)
        if refused:
            with pytest.raises(ClientError):
                self.table.put(spec) if replace else self.table.add(spec)
            return
        identity = self.table.put(spec) if replace else self.table.add(spec)
        assert identity.policy is policy
        self.model[cid] = Entry(policy, token, sources)

    @rule(cid=st.sampled_from(IDS))
    def replace_policy(self, cid: str) -> None:
        policy = Policy(default="allow")
        if cid not in self.model:
            with pytest.raises(KeyError):
                self.table.replace(cid, policy)
            return
        self.table.replace(cid, policy)
        self.model[cid].policy = policy

    @rule(cid=st.sampled_from(IDS))
    def remove(self, cid: str) -> None:
        removed = self.table.remove(cid)
        assert (removed is not None) == (cid in self.model)
        self.model.pop(cid, None)

    @rule(token=st.sampled_from(TOKENS), host=st.integers(0, 3))
    def request_with_token(self, token: str, host: int) -> None:
        source = ipaddress.ip_address(f"198.18.{host}.7")
        owner = next((c for c, e in self.model.items() if e.token == token), None)
        if owner is None:
            with pytest.raises(AuthError):
                self.table.identify(source, basic(token))
            return
        identity = self.table.identify(source, basic(token))
        assert identity.client_id == owner
        assert identity.policy is self.model[owner].policy

    @rule(host=st.integers(0, 5))
    def request_by_source(self, host: int) -> None:
        source = ipaddress.ip_address(f"198.18.{host}.7")
        owner = next(
            (c for c, e in self.model.items() if any(source in n for n in e.sources)), None
        )
        identity = self.table.identify(source, None)
        if owner is None:
            assert identity.client_id is None
            assert identity.policy is self.default
        else:
            assert identity.client_id == owner
            assert identity.policy is self.model[owner].policy

    @invariant()
    def same_clients(self) -> None:
        assert set(self.table.client_ids) == set(self.model)
        assert self.table.trivial == (not self.model)


TestClientMachine = ClientMachine.TestCase
TestClientMachine.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)


class LeaseMachine(RuleBasedStateMachine):
    """Shared resources are closed exactly when their last holder lets go."""

    def __init__(self) -> None:
        super().__init__()
        self.leases: Leases[str] = Leases()
        self.model: dict[str, set[str]] = {}
        self.closed: set[str] = set()

    @rule(owner=st.sampled_from(IDS), res=st.sampled_from(["l1", "l2", "l3"]))
    def hold(self, owner: str, res: str) -> None:
        self.leases.hold(owner, res)
        self.model.setdefault(res, set()).add(owner)
        self.closed.discard(res)

    @rule(owner=st.sampled_from(IDS))
    def drop(self, owner: str) -> None:
        freed = self.leases.drop(owner)
        expect = {r for r, o in self.model.items() if o == {owner}}
        assert set(freed) == expect
        for holders in self.model.values():
            holders.discard(owner)
        self.model = {r: o for r, o in self.model.items() if o}

    @invariant()
    def holders_match(self) -> None:
        for res in ["l1", "l2", "l3"]:
            assert self.leases.holders(res) == frozenset(self.model.get(res, set()))


TestLeaseMachine = LeaseMachine.TestCase
TestLeaseMachine.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)


def test_removed_client_token_and_source_stop_matching() -> None:
    # issue 11: a released gateway sandbox's token and /32 kept working
    net = ipaddress.ip_network("198.18.9.2/32")
    table = ClientTable(Settings(Policy()))
    table.add(ClientSpec("a", Policy(default="allow"), "tok", (net,)))
    assert table.identify(net.network_address, None).client_id == "a"
    table.remove("a")
    assert table.identify(net.network_address, None).client_id is None
    with pytest.raises(AuthError):
        table.identify(None, basic("tok"))


@settings(max_examples=500)
@given(
    st.one_of(
        st.ip_addresses(v=4),
        st.ip_addresses(v=6),
        st.ip_addresses(v=4).map(lambda a: ipaddress.IPv6Address(f"::ffff:{a}")),
    ),
    st.one_of(st.none(), st.from_regex(r"[a-z0-9-]{1,12}", fullmatch=True)),
)
def test_every_loopback_source_of_a_namespace_is_one_admission_source(
    addr: ipaddress.IPv4Address | ipaddress.IPv6Address, netns: str | None
) -> None:
    """Issue 32 (docs/proxy.md#connection-slots): one process binding several 127.x
    sources is one default client; any other address keeps its own count, and another
    namespace's loopback is another source."""
    text = str(addr)
    mapped = addr.ipv4_mapped if isinstance(addr, ipaddress.IPv6Address) else None
    loopback = addr.is_loopback or (mapped is not None and mapped.is_loopback)
    key = admission_source(text, netns)
    if loopback:
        assert key == ("loopback" if netns is None else f"loopback@{netns}")
    else:
        assert key == text


def test_admission_source_adversarial_spellings() -> None:
    assert admission_source("127.0.0.1", None) == admission_source("127.255.0.9", None)
    assert admission_source("::1", None) == "loopback"
    assert admission_source("127.0.0.1", "sb1") != admission_source("127.0.0.1", "sb2")
    for other in ("1127.0.0.1", "12.7.0.0", "::2", "::ffff:10.0.0.1", "", "loopback"):
        assert admission_source(other, None) == other

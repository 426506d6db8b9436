"""`EgressProxy`'s delegated methods read and behave as the methods they were (issue 33).

`Delegated` (egress/proxy/facade.py) replaced one-line delegating methods; the public API must
not change: the same names, signatures and docstrings, a coroutine function where the
component's is one, on the instance and on the class (`EgressProxy.reserve(proxy, ...)`).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import pytest

from egress import EgressProxy, Policy
from egress.proxy.facade import Delegated

DELEGATED = sorted(n for n, v in vars(EgressProxy).items() if isinstance(v, Delegated))

# the names a proxy delegated by hand before (and must keep)
EXPECTED = {
    "add_client",
    "add_forwarder",
    "execution_summary",
    "metrics",
    "refresh_host_local",
    "remove_client",
    "remove_listener",
    "remove_listeners",
    "replace_settings",
    "reserve",
    "revoke_tunnels",
    "set_client_policy",
    "track_execution",
}


@pytest.fixture
def proxy() -> Iterator[EgressProxy]:
    made = EgressProxy(Policy(), host_local=[])
    yield made
    made.endpoints.reserve.close()


def test_the_delegated_names_are_the_old_ones() -> None:
    assert set(DELEGATED) == EXPECTED


@pytest.mark.parametrize("name", DELEGATED)
def test_a_delegated_method_reads_as_its_component_s(name: str, proxy: EgressProxy) -> None:
    delegated = vars(EgressProxy)[name]
    component = getattr(proxy, delegated.component)
    bound, own = getattr(proxy, name), getattr(component, name)
    assert bound == own  # the component's bound method itself
    assert inspect.signature(bound) == inspect.signature(own)
    on_class = getattr(EgressProxy, name)
    assert inspect.signature(on_class) == inspect.signature(getattr(type(component), name))
    assert on_class.__doc__
    assert on_class.__doc__ == own.__doc__
    assert inspect.iscoroutinefunction(on_class) == inspect.iscoroutinefunction(own)


def test_a_delegated_method_works_through_the_class(proxy: EgressProxy) -> None:
    EgressProxy.reserve(proxy, "198.18.250.0/24")
    assert "198.18.250.0/24" in {str(n) for n in proxy.settings.guard.extra}
    assert EgressProxy.remove_client(proxy, "nobody") is None


async def test_a_delegated_coroutine_works_through_the_class(proxy: EgressProxy) -> None:
    await EgressProxy.remove_listeners(proxy, "no-such-netns")
    assert proxy.listeners == []

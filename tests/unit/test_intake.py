"""`Intake` (egress/proxy/intake.py): readiness as /readyz answers it (docs/metrics.md), and
`EgressProxy.url`, set once its first listener is bound. A real proxy on loopback."""

from __future__ import annotations

import pytest

from egress import EgressProxy, Policy


async def test_ready_says_why_not_before_start_and_after_stop() -> None:
    proxy = EgressProxy(Policy())
    assert proxy.intake.ready() == (False, "not listening")
    async with proxy:
        assert proxy.intake.ready() == (True, "ready")
    assert proxy.intake.ready() == (False, "stopping")


async def test_a_proxy_without_listeners_is_not_ready() -> None:
    async with EgressProxy(Policy(), listen=()) as proxy:
        assert proxy.intake.ready() == (False, "not listening")
        with pytest.raises(AttributeError):
            _ = proxy.url  # no listener, no URL to hand out


async def test_url_is_the_first_listener_once_bound() -> None:
    proxy = EgressProxy(Policy(), listen=["127.0.0.1:0", "127.0.0.1:0"])
    with pytest.raises(AttributeError):
        _ = proxy.url
    async with proxy:
        host, port = proxy.addresses[0]
        assert proxy.url == f"http://{host}:{port}"
        assert proxy.proxy_url("t0k", "sb") == f"http://sb:t0k@{host}:{port}"

"""The harness itself: a test host is reachable, and nothing is left afterwards."""

from __future__ import annotations

import pytest

import harness
from servers import run, start_origin

pytestmark = pytest.mark.netns


async def test_reach_server_in_test_host_and_leave_nothing() -> None:
    with harness.test_host() as host:
        assert host.addr_ns.startswith("198.18.")
        origin = await start_origin(host, 8080)
        try:
            rc, out, err = await run(
                "curl",
                "-sS",
                "--noproxy",
                "*",
                "--max-time",
                "5",
                f"http://{host.addr_ns}:8080/hello",
            )
        finally:
            await origin.close()
        assert rc == 0, err
        assert '"path": "/hello"' in out
        assert [s.path for s in origin.seen] == ["/hello"]
        ns, link = host.ns, host.link_root
    assert ns not in harness.ip("netns", "list").stdout
    assert link not in harness.ip("link").stdout
    assert harness.leftovers(harness.os.getpid()) == []


def test_stray_benchmark_address_fails_locally() -> None:
    # The safety net: no test host holds 198.18.255.254, so the prohibit route answers.
    r = harness.ip("route", "get", "198.18.255.254", check=False)
    assert "prohibit" in r.stdout or r.returncode != 0

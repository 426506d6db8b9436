"""The harness itself: a test host is reachable, and nothing is left afterwards."""

from __future__ import annotations

import os
import subprocess
import sys

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
    mine = harness.ip("route", "show", "type", "prohibit", harness.SAFETY_NET).stdout
    assert f"metric {os.getpid()}" in mine, "this session's own route, whoever else runs"


SESSION = """
import sys
sys.path.insert(0, {tests!r})
import harness
with harness.safety_net({net!r}) as added:
    print(added, flush=True)
    sys.stdin.read()
"""


def test_the_safety_net_outlives_a_concurrent_session_that_ends_first() -> None:
    """Several checkouts run their tests on one machine at once. With one shared route, the
    session that added it removed it when it ended, while a later one still relied on it.
    Two sessions here, on an unused /30 of the test range: the first ends, the second's net
    holds; after both, nothing is left."""
    net = "198.19.254.248/30"

    def held() -> str:
        return harness.ip("route", "show", "type", "prohibit", net).stdout.strip()

    code = SESSION.format(tests=os.path.dirname(harness.__file__), net=net)
    first, second = (
        subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    )
    try:
        for session in (first, second):
            assert session.stdout is not None
            assert session.stdout.readline().strip() == "True"
        first.communicate("", timeout=60)
        assert held() == f"prohibit {net} proto {harness.SAFETY_PROTO} metric {second.pid}"
    finally:
        for session in (first, second):
            if session.poll() is None:
                session.communicate("", timeout=60)
    assert held() == ""


def test_a_killed_sessions_safety_net_is_swept_and_nothing_else() -> None:
    """A session killed (SIGKILL, or the machine's OOM killer) never removes its prohibit
    route, and every later session added one more. The next session sweeps the routes of
    sessions that are gone, by their metric (the PID) and protocol (SAFETY_PROTO): never a
    live session's, nor a prohibit route of the same range that is not a session's."""
    net = "198.19.254.244/30"

    def held() -> list[str]:
        shown = harness.ip("route", "show", "type", "prohibit", net).stdout
        return sorted(" ".join(line.split()) for line in shown.splitlines())

    code = SESSION.format(tests=os.path.dirname(harness.__file__), net=net)
    killed, live = (
        subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    )
    ended = subprocess.Popen(["true"])
    ended.wait(timeout=60)
    foreign = ("prohibit", net, "metric", str(ended.pid))  # not a session's, its PID gone
    proto = harness.SAFETY_PROTO
    try:
        for session in (killed, live):
            assert session.stdout is not None
            assert session.stdout.readline().strip() == "True"
        killed.kill()
        killed.communicate(timeout=60)  # reaps it and closes its pipes
        harness.ip("route", "add", *foreign)
        assert f"prohibit {net} proto {proto} metric {killed.pid}" in held()
        assert harness.stale_safety_nets(net) == [killed.pid]
        harness.sweep_safety_nets(net)
        assert held() == sorted(
            [
                f"prohibit {net} metric {ended.pid}",
                f"prohibit {net} proto {proto} metric {live.pid}",
            ]
        )
    finally:
        live.communicate("", timeout=60)
        harness.ip("route", "del", *foreign, check=False)
        harness.ip("route", "del", "prohibit", net, "metric", str(killed.pid), check=False)
    assert held() == []

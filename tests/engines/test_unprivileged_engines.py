"""The unprivileged path end to end. The frameworks' trials (verifiers, inspect-ai, and the
boundary under rootless podman) run as the engine run's user `netcut-ci-user`
(tests/ciuser.py) and check every step of issue 30's trial (tests/engines/trialprobe.py;
docs/testing.md#tests-as-the-runs-unprivileged-user).

The boundary as a docker-group user: a real non-root uid with no capability, member of the
group that owns the run's docker socket (tests/unprivuser.py), runs the framework's side
(asuser_boundary.py): `prepare_execution` with the default `cut_mode="auto"` chooses the
helper, which opens the sandbox's loopback listeners inside its namespace and passes them back
over a unix socket, then cuts (docs/user-guide.md#helper-mode). The agent, in the container,
reaches the proxy at 127.0.0.1:PORT: allowed 200, blocked 403, direct TCP unreachable; the
release restores. Before listeners came from the helper, this failed in `prepare_execution`
(`cannot open network namespace '/proc/N/ns/net': Permission denied`).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from enginelib import BOX, Box, docker_client_path, sh
from frameworks.frameworkvenv import framework_venv
from test_boundary_engines import http_server, other_host, wget_in
from test_harbor_as_user import outside_server
from trialprobe import (
    assert_cut,
    assert_open,
    assert_unprivileged,
    lines,
    peer_container,
    resolvers,
    script,
)
from unprivuser import SYSTEM_PYTHON, User, docker_group_user

from netcut import api
from netcut import resolve as target

import harness
from ciuser import CiUser
from dnslog import QueryLog
from servers import run, start_origin

pytestmark = pytest.mark.netns
HERE = os.path.dirname(os.path.abspath(__file__))
AGENT = os.path.join(HERE, "asuser_boundary.py")
VERIFIERS = os.path.join(HERE, "asuser_verifiers.py")
INSPECT = os.path.join(HERE, "asuser_inspect.py")


@pytest.fixture(scope="module")
def docker_user() -> Iterator[User]:
    if os.geteuid() != 0:
        pytest.skip("making a user needs root")
    with docker_group_user() as user:
        yield user


class AsUser:
    """asuser_boundary.py running as `user`: its JSON lines, and `release` on its stdin."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def line(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        raw = await asyncio.wait_for(self.proc.stdout.readline(), 120)
        if not raw:
            assert self.proc.stderr is not None
            err = await self.proc.stderr.read()
            raise AssertionError(f"the user's process ended: {err.decode(errors='replace')}")
        said: dict[str, Any] = json.loads(raw)
        return said

    async def release(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"release\n")
        await self.proc.stdin.drain()
        return await self.line()

    async def close(self) -> None:
        """Its stdin closed (it then tears down what it made), killed if it hangs."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 120)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()


async def as_user(
    user: User, path: str | None, *args: str, script: str = AGENT, site: list[str] | None = None
) -> AsUser:
    proc = await asyncio.create_subprocess_exec(
        *user.argv(SYSTEM_PYTHON, script, *args),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=user.env(path, site),
        cwd=user.home,
    )
    return AsUser(proc)


@pytest.mark.engine("docker")
@pytest.mark.parametrize("client", ["ce", "debian"])
@pytest.mark.parametrize("transparent", [False, True], ids=["proxy", "transparent"])
async def test_a_docker_group_user_prepares_a_loopback_sandbox(
    client: str,
    transparent: bool,
    docker_user: User,
    make_box: Callable[..., Box],
    test_host: harness.TestHost,
) -> None:
    box = make_box("docker")
    routes = box.routes()
    origin = await start_origin(test_host, 80)
    pins = [f"pypi.test={test_host.addr_ns}", f"evil.test={test_host.addr_ns}"]
    path = docker_client_path(client, os.path.join(docker_user.home, f"bin-{client}"))
    try:
        with other_host() as other, http_server(other) as other_port:
            direct = f"http://{other}:{other_port}/"
            rc, out, err = await wget_in(box, direct)
            assert (rc, out) == (0, "direct"), err  # reachable before: the refusal means it
            kwargs: dict[str, object] = {"transparent": transparent}
            if not transparent:
                kwargs["expect_blocked"] = [f"{other}:{other_port}"]
            agent = await as_user(
                docker_user, path, f"docker:{box.name}", json.dumps(pins), json.dumps(kwargs)
            )
            try:
                prepared = await agent.line()
                assert "error" not in prepared, prepared
                assert int(prepared["caps"], 16) == 0  # no capability at all
                assert prepared["cut_mode"] == "helper"
                assert "lacks CAP_SYS_ADMIN" in prepared["reason"]
                assert "@127.0.0.1:3128" in prepared["proxy_url"]
                assert all(p[2] == "connected" for p in prepared["probe"] if p[1] == "reachable")
                # the user's record is its own (NETCUT_STATE_DIR): root sees the cut itself
                seen = api.status(target.container(box.name, "docker"))
                assert {"IPv4 backstop", "IPv6 backstop"} <= set(seen.details), seen
                assert "default via" not in box.routes()
                proxy = prepared["proxy_url"]

                rc, out, err = await wget_in(box, "http://pypi.test/simple/", proxy)
                assert rc == 0, err
                assert '"path": "/simple/"' in out
                rc, out, err = await wget_in(box, "http://evil.test/", proxy)
                assert rc != 0
                assert "403" in err, (out, err)
                if transparent:  # no proxy configured: redirected to the proxy, judged
                    rc, out, err = await wget_in(box, "http://pypi.test/transparent/")
                    assert rc == 0, err
                    assert '"path": "/transparent/"' in out
                    rc, out, err = await wget_in(box, "http://evil.test/")
                    assert rc != 0  # its DNS responder gives a blocked name no address
                    assert "bad address 'evil.test'" in err, (out, err)
                rc, out, _ = await wget_in(box, direct)
                assert rc != 0
                assert out != "direct"

                released = await agent.release()
                assert released["allowed"] == {"allow": 2 if transparent else 1}
                assert "evil.test" in released["blocked"]
            finally:
                await agent.close()
        assert box.routes_back_to(routes) == routes
        assert api.status(target.container(box.name, "docker")).state == "not cut"
    finally:
        await origin.close()


def _records(user: User) -> list[str]:
    return sorted(n for n in os.listdir(user.records()) if n.endswith(".json"))


async def _prepared_by(user: User, box: Box) -> AsUser:
    """`prepare_execution` of `box` by `user`'s process (the helper, loopback mode), held."""
    agent = await as_user(user, None, f"docker:{box.name}", "[]", "{}")
    prepared = await agent.line()
    assert "error" not in prepared, prepared
    assert prepared["cut_mode"] == "helper"
    return agent


@pytest.mark.engine("docker")
async def test_a_docker_group_users_record_is_found_by_root_forget_and_gc(
    docker_user: User, make_box: Callable[..., Box], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record of a cut the boundary made through the helper (one helper run: listeners
    passed back, then the cut) is keyed by the namespace the helper saw, as direct mode keys
    its own (docs/netcut.md#one-algorithm): root in direct mode finds it in the user's record
    directory (status `cut`, never "no restore record"; restore undoes the cut),
    `release_execution(forget=True)` removes it, and `netcut gc` collects it once the
    container is gone. A record keyed by container id was invisible to all three."""
    box = make_box("docker")
    routes = box.routes()
    key = _key(box)
    monkeypatch.setenv("NETCUT_STATE_DIR", docker_user.records())
    ref = target.container(box.name, "docker")

    agent = await _prepared_by(docker_user, box)
    try:
        assert _records(docker_user) == [key]
        seen = api.status(ref)  # root, direct mode, the user's record directory
        assert seen.state == "cut", seen
        assert "no restore record" not in seen.details
        assert api.restore(ref).changed  # root undoes the user's cut, from its record
        assert box.routes_back_to(routes) == routes
        assert _records(docker_user) == []
    finally:
        await agent.close()

    agent = await _prepared_by(docker_user, box)  # cut again, by the user
    try:
        assert _records(docker_user) == [key]
        released = await _send(agent, "forget")
        assert released["step"] == "release"
        assert _records(docker_user) == []  # forgotten (a sandbox about to be destroyed)
    finally:
        await agent.close()

    other = make_box("docker")
    agent = await _prepared_by(docker_user, other)
    await agent.close()  # ends without releasing: the cut and its record stay
    done = docker_user.netcut("gc", "--json")  # a live container's record stays
    assert (done.returncode, json.loads(done.stdout)["removed"]) == (0, []), done.stderr
    gone = _key(other)
    assert _records(docker_user) == [gone]
    sh("docker", "rm", "-f", other.name)
    done = docker_user.netcut("gc", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["removed"] == [gone.removesuffix(".json")]
    assert _records(docker_user) == []


def _key(box: Box) -> str:
    """The name of the record of `box`'s namespace: its nsfs identity."""
    st = os.stat(box.netns)
    return f"{st.st_dev}-{st.st_ino}.json"


async def _send(agent: AsUser, line: str) -> dict[str, Any]:
    assert agent.proc.stdin is not None
    agent.proc.stdin.write(f"{line}\n".encode())
    await agent.proc.stdin.drain()
    return await agent.line()


@pytest.mark.engine("docker")
@pytest.mark.timeout(600)
async def test_verifiers_docker_runtime_as_a_docker_group_user(
    ci_user: CiUser,
    ci_user_tmp: Path,
    test_host: harness.TestHost,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A verifiers trial as the run's docker-group user (issue 30): `EgressDockerRuntime` in
    verifiers' venv, default cut_mode, run by `netcut-ci-user` with no capability (it used
    to fail in `start()`: `cannot open network namespace '/proc/N/ns/net': Permission
    denied`). Its container is on Docker's default bridge (verifiers' `--network bridge`),
    beside another container there:

    - setup (started, before the cut): a host outside the policy and the other container
      answer;
    - cut (the helper, and why): allowed 200 through the proxy, blocked 403; the outside
      host, the other container and every resolver in the container's resolv.conf (the
      host's own, asked only once cut) answer nothing;
    - released: the routes are back and the outside host and the other container answer;
    - the audit log has the decisions, and `egress audit verify` passes on it, as the user.
    """
    venv = framework_venv("verifiers", tmp_path_factory.mktemp("fw"))
    audit = ci_user_tmp / "audit.jsonl"
    origin = await start_origin(test_host, 80)
    pins = [f"pypi.test={test_host.addr_ns}", f"evil.test={test_host.addr_ns}"]
    peer = f"nc-vu{os.getpid()}-peer"
    argv = [str(venv / "bin" / "python"), VERIFIERS, BOX, json.dumps(pins), str(audit)]
    try:
        with (
            other_host() as other,
            outside_server(other) as (port, outside),
            peer_container(["docker"], peer, BOX) as address,
        ):
            agent = await as_ci_user(ci_user, argv)
            try:
                await _verifiers_trial(agent, ci_user, f"http://{other}:{port}", peer, address)
            finally:
                await agent.close()
        assert outside == ["/setup", "/verify"]  # nothing in between: the cut held
        assert [s.path for s in origin.seen] == ["/simple/"]
    finally:
        await origin.close()
    decided = _decisions(audit)
    assert ("pypi.test", "GET", "allow") in decided, decided
    assert ("evil.test", "GET", "block") in decided, decided
    verified = ci_user.run(["egress", "audit", "verify", str(audit)])
    assert verified.returncode == 0, verified.stdout + verified.stderr


async def _verifiers_trial(
    agent: AsUser, user: CiUser, direct: str, peer: str, address: str
) -> None:
    started = await agent.line()
    assert "error" not in started, started
    assert_unprivileged(started, user.uid, user.group_gid)
    name = started["container"]
    box = Box(
        "docker", name, int(sh("docker", "inspect", "-f", "{{.State.Pid}}", name).stdout), "", ""
    )
    routes = box.routes()
    # setup, online (never asking the host's resolvers: ask=False)
    rc, out, err = await wget_in(box, f"{direct}/setup")
    assert rc == 0, err
    assert_open(lines(await probe_in(box, script(peer, address, ask=False))))

    prepared = await _send(agent, "cut")
    assert "error" not in prepared, prepared
    assert prepared["cut_mode"] == "helper"
    assert "lacks CAP_SYS_ADMIN" in prepared["reason"], prepared
    proxy = prepared["proxy_url"]
    assert "@127.0.0.1:3128" in proxy
    assert "default via" not in box.routes()
    rc, out, err = await wget_in(box, "http://pypi.test/simple/", proxy)
    assert rc == 0, err
    assert '"path": "/simple/"' in out
    rc, out, err = await wget_in(box, "http://evil.test/", proxy)
    assert rc != 0
    assert "403" in err, (out, err)
    rc, out, err = await wget_in(box, f"{direct}/direct")
    assert rc != 0  # direct: no route
    assert "/direct" not in out
    assert_cut(lines(await probe_in(box, script(peer, address, ask=True))))

    released = await _send(agent, "release")
    assert released["released"] is True
    assert_unprivileged(released, user.uid, user.group_gid)
    assert box.routes_back_to(routes) == routes
    rc, out, err = await wget_in(box, f"{direct}/verify")
    assert rc == 0, err  # restored: online again
    assert_open(lines(await probe_in(box, script(peer, address, ask=False))))


async def probe_in(box: Box, probe: str) -> str:
    """trialprobe's script in the container (the agent): its output."""
    rc, out, err = await run(
        "timeout", "120", box.engine, "exec", box.name, "sh", "-c", probe, timeout=130
    )
    assert rc == 0, (out, err)
    return out


def _decisions(audit: Path) -> set[tuple[str | None, str | None, str | None]]:
    records = [json.loads(x) for x in audit.read_text().splitlines() if x.strip()]
    return {(r.get("host"), r.get("method"), r.get("decision")) for r in records}


async def as_ci_user(user: CiUser, argv: list[str], env: dict[str, str] | None = None) -> AsUser:
    """`argv` as the run's user (tests/ciuser.py), talked to over its stdin and stdout."""
    proc = await asyncio.create_subprocess_exec(
        *user.argv(argv, env=env),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=user.home,
    )
    return AsUser(proc)


# slirp4netns's resolver, which forwards to the host's own: never asked while the network is
# open (no query leaves the machine), only once cut, where nothing may answer
SLIRP_DNS = "10.0.2.3"
PEER_NAME = "peer.test"
PEER_NAME_ADDR = "198.18.0.77"  # only an answer: nothing connects to it


@pytest.mark.engine("podman")
@pytest.mark.timeout(600)
async def test_rootless_podman_loopback_sandbox(
    ci_user: CiUser, ci_user_tmp: Path, test_host: harness.TestHost
) -> None:
    """The loopback-mode trial under the run's user's rootless podman (issue 30; slirp4netns:
    no gateway in the host's namespace, so gateway mode cannot work): the boundary
    (asuser_boundary.py) as `netcut-ci-user`, no capability, cut through the helper. The
    container's one resolver is a DNS server of the test's own on the test host
    (`--dns`, tests/dnslog.py), beside another rootless container of the user's,
    reached at its published port:

    - setup (before the cut): the outside host, our resolver (the name's answer) and the
      other container answer;
    - cut (the helper, and why): allowed 200 through the proxy, blocked 403; the outside
      host, the other container, our resolver and slirp4netns's 10.0.2.3 answer nothing
      (and our resolver saw no query);
    - released: all of it answers again;
    - the audit log has the decisions, and `egress audit verify` passes on it, as the user.
    """
    podman = ci_user.argv(["podman"])
    name = f"nc-u{os.getpid()}-podbox"
    resolver = QueryLog({PEER_NAME: PEER_NAME_ADDR})
    loop = asyncio.get_running_loop()
    udp, _ = await loop.create_datagram_endpoint(
        lambda: resolver, local_addr=(test_host.addr_root, 53)
    )
    audit = ci_user_tmp / "audit.jsonl"
    origin = await start_origin(test_host, 80)
    pins = [f"pypi.test={test_host.addr_ns}", f"evil.test={test_host.addr_ns}"]
    try:
        done = await _as_user(ci_user, "podman", "run", "-d", "--name", name, "--cap-drop", "ALL",
                              "--dns", test_host.addr_root, BOX, "sleep", "3600")  # fmt: skip
        assert done.returncode == 0, done.stderr
        with (
            other_host() as other,
            outside_server(other) as (port, outside),
            peer_container(podman, f"{name}-peer", BOX, ["-p", f"{test_host.addr_root}::7000"]),
        ):
            shown = await _as_user(ci_user, "podman", "port", f"{name}-peer", "7000")
            peer_port = int(shown.stdout.strip().rsplit(":", 1)[1])
            await _podman_trial(
                ci_user, name, f"http://{other}:{port}", peer_port, resolver, test_host, pins, audit
            )
        assert outside == ["/setup", "/verify"]  # nothing in between: the cut held
        assert [s.path for s in origin.seen] == ["/simple/"]
    finally:
        udp.close()
        await origin.close()
        ci_user.run(["podman", "rm", "-f", "-t", "0", name])
    decided = _decisions(audit)
    assert ("pypi.test", "GET", "allow") in decided, decided
    assert ("evil.test", "GET", "block") in decided, decided
    verified = ci_user.run(["egress", "audit", "verify", str(audit)])
    assert verified.returncode == 0, verified.stdout + verified.stderr


async def _podman_trial(
    user: CiUser,
    name: str,
    direct: str,
    peer_port: int,
    resolver: QueryLog,
    test_host: harness.TestHost,
    pins: list[str],
    audit: Path,
) -> None:
    async def wget(url: str, proxy: str | None = None) -> tuple[int, str, str]:
        env = ["-e", f"http_proxy={proxy}"] if proxy else []
        argv = [
            "timeout",
            "20",
            "podman",
            "exec",
            *env,
            name,
            "busybox",
            "wget",
            "-q",
            "-O",
            "-",
            url,
        ]
        done = await _as_user(user, *argv)
        return done.returncode, done.stdout, done.stderr

    async def probed(script: str) -> dict[str, str]:
        done = await _as_user(user, "timeout", "120", "podman", "exec", name, "sh", "-c", script)
        assert done.returncode == 0, done.stderr
        return lines(done.stdout)

    # our resolver is the container's only one (slirp4netns's is never asked while open)
    probe = script(PEER_NAME, test_host.addr_root, ask=True, port=peer_port)
    shown = await _as_user(user, "podman", "exec", name, "cat", "/etc/resolv.conf")
    listed = [x.split()[1] for x in shown.stdout.splitlines() if x.startswith("nameserver")]
    assert listed == [test_host.addr_root], shown.stdout
    rc, _, err = await wget(f"{direct}/setup")
    assert rc == 0, err  # slirp4netns reaches the host
    assert_open(await probed(probe), PEER_NAME_ADDR)
    assert (PEER_NAME, "A") in resolver.asked

    kwargs = {"expect_blocked": [direct.removeprefix("http://")]}
    argv = [
        sys.executable,
        AGENT,
        f"podman:{name}",
        json.dumps(pins),
        json.dumps(kwargs),
        str(audit),
    ]
    agent = await as_ci_user(user, argv)
    try:
        prepared = await agent.line()
        assert "error" not in prepared, prepared
        assert_unprivileged(prepared, user.uid, None)
        assert prepared["cut_mode"] == "helper"
        assert "lacks CAP_SYS_ADMIN" in prepared["reason"], prepared
        proxy = prepared["proxy_url"]
        assert "@127.0.0.1:3128" in proxy
        rc, out, err = await wget("http://pypi.test/simple/", proxy)
        assert rc == 0, err
        assert '"path": "/simple/"' in out
        rc, out, err = await wget("http://evil.test/", proxy)
        assert rc != 0
        assert "403" in err, (out, err)
        rc, out, _ = await wget(f"{direct}/direct")
        assert rc != 0
        assert "/direct" not in out
        asked = len(resolver.asked)
        extra = [SLIRP_DNS]  # asked once cut, where nothing may answer
        said = await probed(
            script(PEER_NAME, test_host.addr_root, ask=True, extra=extra, port=peer_port)
        )
        assert f"dns_{SLIRP_DNS}" in said, said
        assert_cut(said, PEER_NAME_ADDR)
        assert len(resolver.asked) == asked, resolver.asked  # refused in the container
        released = await agent.release()
        assert released["allowed"] == {"allow": 1}
    finally:
        await agent.close()
    rc, _, err = await wget(f"{direct}/verify")
    assert rc == 0, err  # restored
    assert_open(await probed(probe), PEER_NAME_ADDR)


async def _as_user(user: CiUser, *argv: str) -> subprocess.CompletedProcess[str]:
    """`argv` as the run's user, in a thread (the test's servers answer on this loop)."""
    return await asyncio.to_thread(user.run, list(argv), timeout=150)


@pytest.mark.engine("docker")
@pytest.mark.timeout(600)
async def test_inspect_egress_sandbox_as_a_docker_group_user(
    ci_user: CiUser,
    ci_user_tmp: Path,
    make_box: Callable[..., Box],
    test_host: harness.TestHost,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """An inspect-ai trial as the run's docker-group user (issue 30): inspect's `eval()` in
    inspect's venv, the `egress` sandbox with its defaults (loopback, `auto`), run by
    `netcut-ci-user` with no capability (it used to fail with `ExecutionNotReady
    kind=namespace`). The container is on the run's user-defined network `nc-ci` (Docker's
    embedded resolver 127.0.0.11 in its resolv.conf), beside another container there:

    - setup (before the sample): a host outside the policy answers; the other container's
      name resolves through the container's resolvers, and its port answers;
    - the agent (inspect's `bash()` tool), cut by the helper (the solver sees its mode and
      why): allowed 200, blocked 403; the outside host, the other container and its name
      through every resolver the container has answer nothing;
    - released at the sample's end: the routes are back, and all of it answers again;
    - the audit log has the decisions, and `egress audit verify` passes on it, as the user.
    """
    venv = framework_venv("inspect", tmp_path_factory.mktemp("fw"))
    box = make_box("docker")
    routes = box.routes()
    audit = ci_user_tmp / "audit.jsonl"
    peer = f"nc-iu{os.getpid()}-peer"
    origin = await start_origin(test_host, 80)
    try:
        with (
            other_host() as other,
            outside_server(other) as (port, outside),
            peer_container(["docker"], peer, BOX, ["--network", "nc-ci"]) as address,
        ):
            direct = f"http://{other}:{port}"
            probe = script(peer, address, ask=True)  # 127.0.0.11 answers container names
            rc, _, err = await wget_in(box, f"{direct}/setup")
            assert rc == 0, err
            assert_open(lines(await probe_in(box, probe)), address)
            spec = {
                "container": box.name,
                "commands": [
                    "busybox wget -q -O - http://pypi.test/agent",
                    "busybox wget -q -O - http://evil.test/refused 2>&1",
                    "unset http_proxy HTTP_PROXY; busybox wget -q -T 5 -O - "
                    f"{direct}/direct 2>&1 || echo unreachable",
                    probe,
                ],
                "audit": str(audit),
                "resolve": {"pypi.test": test_host.addr_ns, "evil.test": test_host.addr_ns},
                "allow": ["pypi.test"],
                "log_dir": str(ci_user_tmp / "logs"),
            }
            argv = [str(venv / "bin" / "python"), INSPECT, json.dumps(spec)]
            done = await asyncio.to_thread(ci_user.run, argv, cwd=str(ci_user_tmp), timeout=540)
            assert done.returncode == 0, done.stderr[-3000:]
            result = json.loads(done.stdout.strip().splitlines()[-1])
            assert result["status"] == "success", result
            assert result["error"] is None
            # released with restore at the sample's end
            assert box.routes_back_to(routes) == routes
            rc, _, err = await wget_in(box, f"{direct}/verify")
            assert rc == 0, err
            assert_open(lines(await probe_in(box, probe)), address)
        for when in ("before", "after"):
            assert_unprivileged(result[when], ci_user.uid, ci_user.group_gid)
        assert result["cut"]["cut_mode"] == "helper", result["cut"]
        assert "lacks CAP_SYS_ADMIN" in result["cut"]["reason"], result["cut"]
        agent, refused, blocked, probed = result["tools"]
        assert '"path": "/agent"' in agent
        assert "403" in refused
        assert "unreachable" in blocked
        assert "/direct" not in blocked
        assert_cut(lines(probed), address)
        assert "127.0.0.11" in resolvers(lines(probed))  # a user-defined network's
        assert [s.path for s in origin.seen] == ["/agent"]
        assert outside == ["/setup", "/verify"]  # nothing in between: the cut held
    finally:
        await origin.close()
    decided = _decisions(audit)
    assert ("pypi.test", "GET", "allow") in decided, decided
    assert ("evil.test", "GET", "block") in decided, decided
    verified = ci_user.run(["egress", "audit", "verify", str(audit)])
    assert verified.returncode == 0, verified.stdout + verified.stderr


@pytest.mark.engine("docker")
async def test_a_namespace_sandbox_as_a_user_says_it_needs_root(docker_user: User) -> None:
    """Without root, a sandbox that is not a container has no helper: `auto` uses direct
    mode, which fails closed with `kind="namespace"` and says why that mode, and what to do."""
    agent = await as_user(docker_user, None, "pid:1", "[]", "{}")
    try:
        said = await agent.line()
    finally:
        await agent.close()
    error = said["error"]
    assert error.startswith("ExecutionNotReady"), said
    assert "Permission denied" in error
    assert "cut_mode 'direct'" in error
    assert "direct mode needs root" in error

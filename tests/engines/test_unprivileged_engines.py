"""The boundary as a docker-group user: a real non-root uid with no capability, member of the
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
import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from enginelib import BOX, Box, docker_client_path, engine_down, sh
from frameworks.frameworkvenv import framework_venv
from test_boundary_engines import http_server, other_host, wget_in
from unprivuser import SYSTEM_PYTHON, User, docker_group_user, rootless_podman_user

from netcut import api
from netcut import resolve as target

import harness
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
async def test_verifiers_docker_runtime_as_a_docker_group_user(
    docker_user: User, test_host: harness.TestHost, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """verifiers' `EgressDockerRuntime` as a docker-group user: `start()` used to fail with
    `NamespaceError: cannot open network namespace '/proc/N/ns/net': Permission denied`
    (its callback listener was opened with setns); now the helper opens it, and the cut
    that `prepare_execution` makes holds: allowed 200, blocked 403, direct unreachable."""
    venv = framework_venv("verifiers", tmp_path_factory.mktemp("fw"))
    site = [str(p) for p in (venv / "lib").glob("python3*/site-packages")]
    origin = await start_origin(test_host, 80)
    pins = [f"pypi.test={test_host.addr_ns}", f"evil.test={test_host.addr_ns}"]
    agent = await as_user(docker_user, None, BOX, json.dumps(pins), script=VERIFIERS, site=site)
    with contextlib.ExitStack() as stack:
        other = stack.enter_context(other_host())
        direct = f"http://{other}:{stack.enter_context(http_server(other))}/"
        await _verifiers_trial(agent, test_host, direct)
    await origin.close()


async def _verifiers_trial(agent: AsUser, test_host: harness.TestHost, direct: str) -> None:
    try:
        started = await agent.line()
        assert "error" not in started, started
        prepared = await agent.line()
        assert "error" not in prepared, prepared
        assert prepared["cut_mode"] == "helper"
        box = Box("docker", started["container"], 0, "", "")
        proxy = prepared["proxy_url"]
        assert "@127.0.0.1:3128" in proxy
        rc, out, err = await wget_in(box, "http://pypi.test/simple/", proxy)
        assert rc == 0, err
        rc, out, err = await wget_in(box, "http://evil.test/", proxy)
        assert rc != 0
        assert "403" in err, (out, err)
        rc, out, err = await wget_in(box, direct)
        assert rc != 0  # direct: no route
        released = await agent.release()
        assert released["released"] is True
        rc, out, err = await wget_in(box, direct)
        assert (rc, out) == (0, "direct"), err  # restored: online again
    finally:
        await agent.close()


@pytest.fixture(scope="module")
def rootless_user() -> Iterator[User]:
    if os.geteuid() != 0:
        pytest.skip("making a user needs root")
    if engine_down("podman") is not None:
        pytest.skip(f"no podman to copy {BOX} from")
    with rootless_podman_user(BOX) as user:
        yield user


async def user_run(user: User, *argv: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *user.argv(*argv),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=user.env(),
        cwd=user.home,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


@pytest.mark.engine("podman")
async def test_rootless_podman_loopback_sandbox(
    rootless_user: User, test_host: harness.TestHost
) -> None:
    """Rootless podman (slirp4netns: no gateway in the host's namespace, so gateway mode
    cannot work): the boundary in loopback mode through the helper, as its user."""
    user = rootless_user
    name = f"ncr-box-{os.getpid()}"
    rc, _, err = await user_run(
        user, "podman", "run", "-d", "--name", name, "--cap-drop", "ALL", BOX, "sleep", "3600"
    )
    assert rc == 0, err

    async def wget(url: str, proxy: str | None = None) -> tuple[int, str, str]:
        env = ["-e", f"http_proxy={proxy}"] if proxy else []
        argv = ["podman", "exec", *env, name, "busybox", "wget", "-q", "-O", "-", url]
        return await user_run(user, "timeout", "20", *argv)

    origin = await start_origin(test_host, 80)
    pins = [f"pypi.test={test_host.addr_ns}", f"evil.test={test_host.addr_ns}"]
    try:
        with other_host() as other, http_server(other) as other_port:
            direct = f"http://{other}:{other_port}/"
            assert (await wget(direct))[:2] == (0, "direct")  # slirp4netns reaches the host
            kwargs = {"expect_blocked": [f"{other}:{other_port}"]}
            agent = await as_user(
                user, None, f"podman:{name}", json.dumps(pins), json.dumps(kwargs)
            )
            try:
                prepared = await agent.line()
                assert "error" not in prepared, prepared
                assert prepared["cut_mode"] == "helper"
                proxy = prepared["proxy_url"]
                assert "@127.0.0.1:3128" in proxy
                rc, out, err = await wget("http://pypi.test/simple/", proxy)
                assert rc == 0, err
                assert '"path": "/simple/"' in out
                rc, out, err = await wget("http://evil.test/", proxy)
                assert rc != 0
                assert "403" in err, (out, err)
                assert (await wget(direct))[0] != 0
                released = await agent.release()
                assert released["allowed"] == {"allow": 1}
            finally:
                await agent.close()
            assert (await wget(direct))[:2] == (0, "direct")  # restored
    finally:
        await origin.close()
        await user_run(user, "podman", "rm", "-f", "-t", "0", name)


@pytest.mark.engine("docker")
@pytest.mark.timeout(600)
async def test_inspect_egress_sandbox_as_a_docker_group_user(
    docker_user: User,
    make_box: Callable[..., Box],
    test_host: harness.TestHost,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """inspect-ai's `eval()` in the `egress` sandbox with its defaults (loopback, `auto`),
    as a docker-group user: it used to fail with `ExecutionNotReady kind=namespace`."""
    venv = framework_venv("inspect", tmp_path_factory.mktemp("fw"))
    site = [str(p) for p in (venv / "lib").glob("python3*/site-packages")]
    box = make_box("docker")
    routes = box.routes()
    work = os.path.join(docker_user.home, f"inspect-{box.name}")
    os.makedirs(work)
    os.chown(work, docker_user.uid, docker_user.gid)
    audit = os.path.join(work, "audit.jsonl")
    origin = await start_origin(test_host, 80)
    try:
        with other_host() as other, http_server(other) as port:
            assert (await wget_in(box, f"http://{other}:{port}/"))[:2] == (0, "direct")
            spec = {
                "container": box.name,
                "commands": [
                    "busybox wget -q -O - http://pypi.test/agent",
                    "busybox wget -q -O - http://evil.test/refused 2>&1",
                    "unset http_proxy HTTP_PROXY; busybox wget -q -T 5 -O - "
                    f"http://{other}:{port}/ 2>&1 || echo unreachable",
                ],
                "audit": audit,
                "resolve": {"pypi.test": test_host.addr_ns, "evil.test": test_host.addr_ns},
                "allow": ["pypi.test"],
                "log_dir": os.path.join(work, "logs"),
            }
            proc = await asyncio.create_subprocess_exec(
                *docker_user.argv(SYSTEM_PYTHON, INSPECT, json.dumps(spec)),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=docker_user.env(site=site),
                cwd=work,
            )
            out, err = await asyncio.wait_for(proc.communicate(), 540)
        assert proc.returncode == 0, err.decode(errors="replace")[-3000:]
        result = json.loads(out.decode().strip().splitlines()[-1])
        assert result["status"] == "success", result
        assert result["error"] is None
        agent, refused, direct = result["tools"]
        assert '"path": "/agent"' in agent
        assert "403" in refused
        assert "unreachable" in direct
        assert "direct" not in direct
        assert [s.path for s in origin.seen] == ["/agent"]
        assert box.routes_back_to(routes) == routes  # released with restore at the end
        rc, said, why = await run(sys.executable, "-m", "egress.cli", "audit", "verify", audit)
        assert rc == 0, said + why
    finally:
        await origin.close()


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

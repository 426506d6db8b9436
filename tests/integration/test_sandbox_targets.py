"""A sandbox named any way netcut reads a target (issue 10): int PID, "pid:N", a bare digit
string, /proc/N/ns/net, a name. Real namespaces, a real agent (`curl`, no capabilities).

One parser (netcut.targetref) serves both packages, so the listener egress opens and the
namespace netcut cuts are the same one whatever the spelling; every spelling of a PID is one
sandbox with a client id of its own (`pid-N`, never `net`); a listener that cannot be opened
in the sandbox leaves nothing behind, so a retry does not meet our own socket.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest

import netcut
from egress import EgressProxy, Policy, build_settings, prepare_execution, release_execution
from egress.boundary import ExecutionNotReady
from egress.proxy.net.netns import NamespaceError, namespace_path

import harness
import userns
from servers import Origin, run, start_origin

CAPLESS = userns.CAPLESS


@dataclass
class Scene:
    sandbox: harness.TestHost
    upstream: harness.TestHost
    origin: Origin
    proxy: EgressProxy
    pid: int  # a capless process living in the sandbox's namespace


def _in_namespace(pid: int, ns: str) -> bool:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(f"/run/netns/{ns}").st_ino
    except OSError:
        return False


@contextlib.contextmanager
def resident(host: harness.TestHost, *argv: str) -> Iterator[subprocess.Popen[str]]:
    """A process in `host`'s namespace, once it is there (exec'd past `ip netns exec`)."""
    proc = host.popen(*argv, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        assert _in_namespace(proc.pid, host.ns)
        yield proc
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


SLEEPER = ["/usr/bin/python3", "-c", "import time; print('ready', flush=True); time.sleep(120)"]
HOLDER = [
    "/usr/bin/python3",
    "-c",
    "import socket, time; s = socket.socket(); "
    "s.bind(('127.0.0.1', 3128)); s.listen(); print('ready', flush=True); time.sleep(120)",
]


@pytest.fixture
async def scene(test_host_factory: object) -> AsyncIterator[Scene]:
    sandbox = test_host_factory()  # type: ignore[operator]
    upstream = test_host_factory()  # type: ignore[operator]
    origin = await start_origin(upstream, 80)
    proxy = EgressProxy(build_settings({}), listen=["127.0.0.1:0"])
    await proxy.start()
    try:
        with resident(sandbox, *CAPLESS, *SLEEPER) as proc:
            yield Scene(sandbox, upstream, origin, proxy, proc.pid)
    finally:
        await proxy.stop()
        await origin.close()
        with contextlib.suppress(netcut.NetcutError):
            await netcut.restore_async(sandbox.ns)


async def fetch(scene: Scene, proxy_url: str) -> str:
    _, out, _ = await run(
        "ip",
        "netns",
        "exec",
        scene.sandbox.ns,
        *CAPLESS,
        "curl",
        "-s",
        "--max-time",
        "5",
        "-x",
        proxy_url,
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        f"http://{scene.upstream.addr_ns}/",
    )
    return out.strip()


@pytest.mark.userns
def test_every_pid_spelling_names_one_namespace_file(scene: Scene) -> None:
    expected = f"/proc/{scene.pid}/ns/net"
    for spelling in (scene.pid, str(scene.pid), f"pid:{scene.pid}", expected):
        assert namespace_path(spelling) == expected
    assert namespace_path(scene.sandbox.ns) == f"/run/netns/{scene.sandbox.ns}"
    with pytest.raises(NamespaceError, match="no process"):
        namespace_path(2**22 + 1)  # above pid_max: never a process


@pytest.mark.userns
async def test_an_int_pid_is_a_sandbox_with_its_own_client_id(scene: Scene) -> None:
    policy = Policy(allow=[scene.upstream.addr_ns])
    ex = await prepare_execution(scene.pid, policy, scene.proxy)
    assert ex.sandbox == f"pid:{scene.pid}"
    assert ex.client_id == f"pid-{scene.pid}"
    assert await fetch(scene, ex.proxy_url) == "200"
    listeners = len(scene.proxy.listeners)
    for spelling in (str(scene.pid), f"pid:{scene.pid}"):  # the same sandbox, prepared again
        again = await prepare_execution(spelling, policy, scene.proxy)
        assert (again.sandbox, again.client_id) == (ex.sandbox, ex.client_id)
        assert len(scene.proxy.listeners) == listeners
    assert (await netcut.status_async(scene.sandbox.ns)).is_cut, "netcut cut that namespace"
    await release_execution(scene.proxy, again, restore=True)
    assert not (await netcut.status_async(scene.sandbox.ns)).is_cut


@pytest.mark.userns
async def test_proc_path_sandboxes_get_distinct_client_ids(
    scene: Scene, test_host_factory: object
) -> None:
    other = test_host_factory()  # type: ignore[operator]
    with resident(other, *CAPLESS, *SLEEPER) as proc:
        a = await prepare_execution(f"/proc/{scene.pid}/ns/net", Policy(), scene.proxy)
        b = await prepare_execution(f"/proc/{proc.pid}/ns/net", Policy(), scene.proxy)
        assert (a.client_id, b.client_id) == (f"pid-{scene.pid}", f"pid-{proc.pid}")
        await release_execution(scene.proxy, b, restore=True)
    await release_execution(scene.proxy, a, restore=True)


@pytest.mark.userns
async def test_a_listener_that_cannot_open_leaves_nothing_and_a_retry_works(
    scene: Scene,
) -> None:
    policy = Policy(allow=[scene.upstream.addr_ns])
    before = len(scene.proxy.listeners)
    with resident(scene.sandbox, *CAPLESS, *HOLDER):  # 127.0.0.1:3128 taken in the sandbox
        with pytest.raises(ExecutionNotReady, match="in use"):
            await prepare_execution(scene.pid, policy, scene.proxy)
        assert len(scene.proxy.listeners) == before
        assert not (await netcut.status_async(scene.sandbox.ns)).is_cut, "nothing was cut"
    ex = await prepare_execution(scene.pid, policy, scene.proxy)  # no EADDRINUSE from us
    assert await fetch(scene, ex.proxy_url) == "200"
    await release_execution(scene.proxy, ex, restore=True)


@pytest.fixture
async def proxy() -> AsyncIterator[EgressProxy]:
    async with EgressProxy(build_settings({}), listen=["127.0.0.1:0"]) as proxy:
        yield proxy


@pytest.mark.parametrize("value", ["", "pid:0", "pid:x", "docker:-rm"], ids=str)
async def test_a_target_naming_nothing_is_a_value_error_before_anything_opens(
    proxy: EgressProxy, value: str
) -> None:
    # refused before any namespace is touched, so it needs none (and no root)
    before = len(proxy.listeners)
    with pytest.raises(ValueError, match="prepare_execution sandbox"):
        await prepare_execution(value, Policy(), proxy)
    assert len(proxy.listeners) == before

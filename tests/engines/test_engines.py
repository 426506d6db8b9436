"""netcut on real engines: docker, podman and containerd, each in both modes; helper mode with
Docker CE's and Debian's docker client and with helper images whose /bin/sh is bash, busybox
ash and dash (docs/netcut.md#engines-in-ci).

Each test starts a `sleep` container from the busybox-static image up.sh imported, with an
egress proxy (this process) listening on the container's gateway, a bridge address in the root
namespace, and an echo server beside it on a port the cut does not keep. Clients run inside the
container's namespace (curl under nsenter, sockets made there), so nothing depends on what the
image carries. No traffic leaves the machine: the origin is a test host in 198.18.0.0/17 that
only the proxy, in the root namespace, reaches.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import pathlib
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from enginelib import (
    BOX,
    CTR_NAMESPACE,
    HELPER_SHELLS,
    Box,
    docker_client_path,
    machine_podman_state,
    sh,
    shell_image,
)
from pyroute2.netns import create_socket

from egress import EgressProxy, build_settings
from netcut import api
from netcut import resolve as target
from netcut.errors import ApplyFailed, UnsafeTarget
from netcut.helper import image as helperimage
from netcut.helper import mode as helper
from netcut.helper.session import no_such_image

import harness
from servers import run, start_origin

MODES = [
    pytest.param("docker", "direct", "ce", None, marks=pytest.mark.engine("docker")),
    pytest.param("podman", "direct", None, None, marks=pytest.mark.engine("podman")),
    pytest.param("containerd", "direct", None, None, marks=pytest.mark.engine("containerd")),
    *(
        pytest.param(engine, "helper", client, image, marks=pytest.mark.engine(engine),
                     id=f"{engine}{'-' + client if client else ''}-helper-{image or 'default'}")
        for engine, client in (
            ("docker", "api"), ("docker", "ce"), ("docker", "debian"), ("podman", None),
            ("containerd", None),
        )
        for image in (None, *HELPER_SHELLS)
    ),
]  # fmt: skip
# Helper mode through the Docker Engine API, on each docker client (docs/netcut.md#engines-in-ci)
# and on podman.
HELPER_ENGINES = [
    pytest.param("docker", "api", marks=pytest.mark.engine("docker"), id="docker-api"),
    pytest.param("docker", "ce", marks=pytest.mark.engine("docker"), id="docker-ce"),
    pytest.param("docker", "debian", marks=pytest.mark.engine("docker"), id="docker-debian"),
    pytest.param("podman", None, marks=pytest.mark.engine("podman"), id="podman"),
    pytest.param("containerd", None, marks=pytest.mark.engine("containerd"), id="containerd"),
]
pytestmark = pytest.mark.netns


def ref(box: Box) -> target.TargetRef:
    return target.container(box.name, box.engine)


def do_cut(
    box: Box, mode: str, keep: list[str], image: str | None = None, **kw: object
) -> api.CutResult:
    if mode == "helper":
        return helper.cut(ref(box), keep, image=image, **kw)  # type: ignore[arg-type]
    return api.cut(ref(box), keep, **kw)  # type: ignore[arg-type]


def do_status(box: Box, mode: str, image: str | None = None) -> str:
    status = helper.status(ref(box), image=image) if mode == "helper" else api.status(ref(box))
    return status.state


def do_restore(box: Box, mode: str, image: str | None = None) -> api.RestoreResult:
    return helper.restore(ref(box), image=image) if mode == "helper" else api.restore(ref(box))


def has_image(engine: str, image: str) -> bool:
    if engine == "containerd":
        listed = sh("ctr", "-n", CTR_NAMESPACE, "images", "ls", "-q").stdout.split()
        return f"docker.io/library/{image}" in listed
    return sh(engine, "image", "inspect", image, check=False).returncode == 0


def remove_image(engine: str, image: str) -> None:
    if engine == "containerd":
        sh("ctr", "-n", CTR_NAMESPACE, "images", "rm", f"docker.io/library/{image}", check=False)
    else:
        sh(engine, "rmi", "-f", image, check=False)


def use_client(
    engine: str, client: str | None, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Make `docker` on PATH the chosen client for netcut and the test alike; with a client,
    netcut's helper runs through it, not through the Docker Engine API, which is `api`'s
    (docs/netcut.md#the-docker-engine-api)."""
    if engine == "docker" and client == "api":
        monkeypatch.delenv("NETCUT_DOCKER_API", raising=False)
    elif engine == "docker" and client is not None:
        monkeypatch.setenv("PATH", docker_client_path(client, str(tmp_path / "client")))
        monkeypatch.setenv("NETCUT_DOCKER_API", "0")


@contextmanager
def echo_server(addr: str) -> Iterator[int]:
    """A threaded TCP echo server on `addr` (root namespace); yields its port."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((addr, 0))
    srv.listen(16)

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=echo, args=(conn,), daemon=True).start()

    def echo(conn: socket.socket) -> None:
        with conn:
            try:
                while data := conn.recv(4096):
                    conn.sendall(data)
            except OSError:
                return

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield srv.getsockname()[1]
    finally:
        # a close alone leaves `serve` blocked in accept() for good, the socket listening
        # (the kernel holds it for that call); shutdown wakes it (EINVAL), and it ends
        with contextlib.suppress(OSError):
            srv.shutdown(socket.SHUT_RDWR)
        srv.close()


def connect_in(box: Box, addr: str, port: int, timeout: float = 2.0) -> socket.socket:
    sock = create_socket(box.netns, socket.AF_INET, socket.SOCK_STREAM, flags=0)
    sock.settimeout(timeout)
    try:
        sock.connect((addr, port))
    except BaseException:
        sock.close()
        raise
    return sock


def reaches(box: Box, addr: str, port: int) -> bool:
    try:
        with connect_in(box, addr, port, 1.0) as sock:
            sock.sendall(b"ping")
            return sock.recv(4) == b"ping"
    except OSError:
        return False


def echoes(sock: socket.socket) -> bool:
    try:
        sock.sendall(b"x")
        return sock.recv(1) == b"x"
    except OSError:
        return False


def dns_answers(box: Box, name: str) -> bool:
    """A DNS A query for `name` to Docker's embedded resolver, 127.0.0.11:53."""
    query = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00"
    query += b"".join(bytes([len(p)]) + p.encode() for p in name.split("."))
    query += b"\x00\x00\x01\x00\x01"  # root label, type A, class IN
    sock = create_socket(box.netns, socket.AF_INET, socket.SOCK_DGRAM, flags=0)
    with sock:
        sock.settimeout(1.0)
        try:
            sock.sendto(query, ("127.0.0.11", 53))
            return sock.recv(512)[:2] == b"\x12\x34"
        except OSError:
            return False


async def curl_in(box: Box, *args: str) -> tuple[int, str, str]:
    return await run("nsenter", f"--net={box.netns}", "curl", "-sS", "--max-time", "5", *args)


@pytest.mark.parametrize(("engine", "mode", "client", "shell"), MODES)
async def test_cut_probe_status_restore_with_a_proxy_on_the_gateway(
    engine: str,
    mode: str,
    client: str | None,
    shell: str | None,
    make_box: Callable[..., Box],
    test_host: harness.TestHost,
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The whole cycle; helper mode with each docker client and with helper images whose
    /bin/sh is bash (the default image, built here on first use), busybox ash and dash."""
    use_client(engine, client, tmp_path, monkeypatch)
    image = shell_image(engine, shell) if shell else None
    box = make_box(engine)
    routes = box.routes()
    origin = await start_origin(test_host, 80)
    pins = [f"pypi.test={test_host.addr_ns}", f"evil.test={test_host.addr_ns}"]
    settings = build_settings({}, allow=["pypi.test"], block=["evil.test"], resolve=pins)
    try:
        async with EgressProxy(settings, listen=[f"{box.gateway}:0"]) as proxy:
            await _cycle(box, mode, proxy, routes, image)
            assert [s.path for s in origin.seen] == ["/simple/"]
    finally:
        await origin.close()


async def _cycle(box: Box, mode: str, proxy: EgressProxy, routes: str, image: str | None) -> None:
    keep = f"{box.gateway}:{proxy.addresses[0][1]}"
    with echo_server(box.gateway) as side:
        flow = connect_in(box, box.gateway, side)
        assert echoes(flow), "an established flow before the cut"
        assert reaches(box, box.gateway, side)
        if box.engine == "docker":
            assert await asyncio.to_thread(dns_answers, box, box.name), "embedded DNS, before"

        result = await asyncio.to_thread(
            do_cut, box, mode, [keep], image, expect_blocked=[f"{box.gateway}:{side}"]
        )
        assert result.changed
        assert result.probe is not None
        assert result.probe.ok, result.probe.lines()
        assert await asyncio.to_thread(do_status, box, mode, image) == "cut"
        other = "direct" if mode == "helper" else "helper"
        assert await asyncio.to_thread(do_status, box, other, image) == "cut"

        assert not echoes(flow), "the established flow was destroyed"
        flow.close()
        assert not reaches(box, box.gateway, side)
        assert "default" not in box.routes()
        rc, out, err = await curl_in(box, "-x", proxy.url, "http://pypi.test/simple/")
        assert rc == 0, err
        assert json.loads(out)["path"] == "/simple/"
        rc, out, _ = await curl_in(box, "-i", "-x", proxy.url, "http://evil.test/")
        assert " 403 " in out.splitlines()[0]
        rc, _, _ = await curl_in(box, "--noproxy", "*", f"http://{box.gateway}:{side}/")
        assert rc != 0
        if box.engine == "docker":
            assert not await asyncio.to_thread(dns_answers, box, box.name), "embedded DNS, after"

        again = await asyncio.to_thread(do_cut, box, mode, [keep], image)
        assert not again.changed
        restored = await asyncio.to_thread(do_restore, box, mode, image)
        assert restored.changed
        assert box.routes_back_to(routes) == routes
        assert reaches(box, box.gateway, side)
        assert await asyncio.to_thread(do_status, box, mode, image) == "not cut"


@pytest.mark.parametrize(("engine", "client"), HELPER_ENGINES)
def test_the_default_image_is_built_on_first_use_and_engine_errors_are_whole(
    engine: str,
    client: str | None,
    make_box: Callable[..., Box],
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a fresh machine the helper image is not there: Docker CE's client answers
    `No such image: ...`, a blank line and `Run 'docker run --help' for more information`,
    whose last line alone hid the cause, so the image was never built. Each client's whole
    answer is kept, and recognised."""
    use_client(engine, client, tmp_path, monkeypatch)
    box = make_box(engine)
    default = helper.default_image()
    remove_image(engine, default)
    assert not has_image(engine, default)
    assert helper.status(ref(box)).state == "not cut"
    assert has_image(engine, default), "built on first use"

    missing = f"nc-not-there:{box.name}"
    with pytest.raises(ApplyFailed) as caught:
        helper.status(ref(box), image=missing)
    said = str(caught.value)
    assert no_such_image(said), said
    tail = {
        "ce": "Run 'docker run --help' for more information",
        "debian": "See 'docker run --help'.",
    }
    if client == "api":
        assert said.startswith(f"No such image: {missing} (docker engine API: "), said
    elif client is not None:
        assert said.splitlines()[-1] == tail[client], said
        assert f"No such image: {missing}" in said, said
    elif engine == "podman":
        assert f"{missing}: image not known" in said, said
    else:
        assert f'image "docker.io/library/{missing}": not found' in said, said


@pytest.mark.engine("podman")
def test_podmans_image_builds_write_nothing_machine_wide(make_box: Callable[..., Box]) -> None:
    """Root podman keeps its blob info cache in /var/lib/containers/cache whatever its storage
    configuration and wrote it on every import: up.sh's box image, the helper image netcut
    builds on first use, the helper images by shell. After a run from a fresh clone that
    directory existed, on a machine where it had not. The run's podman keeps the cache in
    memory; nothing under /var/lib/containers appears or changes."""
    box = make_box("podman")
    default = helper.default_image()
    remove_image("podman", default)
    before = machine_podman_state()
    assert helper.status(ref(box)).state == "not cut"
    assert has_image("podman", default), "built on first use"
    after = machine_podman_state()
    changed = {path: v for path, v in after.items() if path not in before or before[path] != v}
    assert changed == {}, "podman wrote machine-wide state"


@pytest.mark.parametrize(("engine", "client"), HELPER_ENGINES)
def test_either_mode_restores_the_other(
    engine: str,
    client: str | None,
    make_box: Callable[..., Box],
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    use_client(engine, client, tmp_path, monkeypatch)
    box = make_box(engine)
    routes = box.routes()
    keep = [f"{box.gateway}:3128"]
    helper.cut(ref(box), keep, probe=False)
    assert api.status(ref(box)).is_cut
    assert api.restore(ref(box)).changed
    assert box.routes_back_to(routes) == routes
    assert helper.status(ref(box)).state == "not cut"

    api.cut(ref(box), keep, probe=False)
    assert helper.status(ref(box)).is_cut
    assert helper.restore(ref(box)).changed
    assert box.routes_back_to(routes) == routes
    assert api.status(ref(box)).state == "not cut"


@pytest.mark.engine("docker")
def test_a_user_supplied_helper_image_keeps_working(make_box: Callable[..., Box]) -> None:
    box = make_box("docker")
    mine = f"nc-user-helper:{box.name}"
    if sh("docker", "image", "inspect", helper.default_image(), check=False).returncode:
        helperimage.build(target.find_runtime("docker"))
    sh("docker", "tag", helper.default_image(), mine)
    try:
        assert helper.cut(ref(box), [f"{box.gateway}:3128"], image=mine, probe=False).changed
        assert helper.restore(ref(box), image=mine).changed
    finally:
        sh("docker", "rmi", mine, check=False)


@pytest.mark.parametrize(("engine", "client"), HELPER_ENGINES)
def test_a_helper_image_without_the_tools_fails_and_changes_nothing(
    engine: str,
    client: str | None,
    make_box: Callable[..., Box],
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The box image has only Debian's busybox (whose `ip` applet has no -j and no iptables):
    its empty state dump must be an error before any change, never a "cut"."""
    use_client(engine, client, tmp_path, monkeypatch)
    box = make_box(engine)
    routes = box.routes()
    with pytest.raises(ApplyFailed, match="helper state dump"):
        helper.cut(ref(box), [f"{box.gateway}:3128"], image=BOX, probe=False)
    assert box.routes_back_to(routes) == routes
    assert api.status(ref(box)).state == "not cut"


@pytest.mark.parametrize(
    "engine",
    [pytest.param(e, marks=pytest.mark.engine(e)) for e in ("docker", "podman")],
)
@pytest.mark.parametrize("mode", ["direct", "helper"])
def test_a_container_holding_net_raw_is_refused(
    engine: str, mode: str, make_box: Callable[..., Box]
) -> None:
    box = make_box(engine, drop_all=False)  # the engine's default set includes NET_RAW
    routes = box.routes()
    with pytest.raises(UnsafeTarget, match="NET_RAW"):
        do_cut(box, mode, [f"{box.gateway}:3128"])
    assert box.routes_back_to(routes) == routes
    assert do_status(box, "direct") == "not cut"


@pytest.mark.engine("containerd")
def test_containerd_cli_cut_by_container_id(
    make_box: Callable[..., Box], capsys: pytest.CaptureFixture[str]
) -> None:
    from netcut.cli import main

    box = make_box("containerd")
    args = ["--container", box.name, "--runtime", "containerd"]
    assert main(["cut", *args, "--keep", f"{box.gateway}:3128", "--no-probe"]) == 0
    assert capsys.readouterr().out.startswith("cut: --container")
    assert main(["status", *args]) == 0
    assert capsys.readouterr().out.splitlines()[:1] == ["cut"]
    # helper mode on containerd: `ctr run --with-ns network:/proc/PID/ns/net` (it used to
    # answer "No help topic for 'inspect'")
    assert main(["status", *args, "--mode", "helper"]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.splitlines()[:1] == ["cut"]
    assert api.status(target.pid(box.pid)).is_cut
    assert main(["restore", *args]) == 0
    assert not api.status(target.pid(box.pid)).is_cut


@pytest.mark.parametrize(("engine", "client"), HELPER_ENGINES)
def test_a_tampered_helper_cut_is_partial_in_both_modes_and_a_cut_repairs_it(
    engine: str,
    client: str | None,
    make_box: Callable[..., Box],
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Root in the namespace undoes the cut (a default route back, an ACCEPT ahead of the
    backstop): status says partial in both modes, and a second helper cut repairs it."""
    use_client(engine, client, tmp_path, monkeypatch)
    box = make_box(engine)
    routes = box.routes()
    keep = [f"{box.gateway}:3128"]
    helper.cut(ref(box), keep, probe=False)
    inside = ["nsenter", f"--net={box.netns}"]
    sh(*inside, "ip", "route", "add", "default", "via", box.gateway, "metric", "50")
    sh(*inside, "iptables-legacy", "-I", "OUTPUT", "-j", "ACCEPT")
    assert api.status(ref(box)).state == "partial"
    found = helper.status(ref(box))
    assert found.state == "partial"
    assert any("default" in d for d in found.details), found.details
    repaired = helper.cut(ref(box), keep, probe=False)
    assert repaired.repaired
    assert api.status(ref(box)).is_cut
    assert "default" not in box.routes()
    assert helper.restore(ref(box)).changed
    assert box.routes_back_to(routes) == routes

"""Listeners from the helper (netcut/helper/listeners.py), without a container: the program
the helper runs is run here by this host's interpreter with `-I -S` (as in the helper image),
against a real `FdPass`; its reply parser is fed hostile input; and the boundary's pure parts
(which sockets a preparation asks for, which cut mode it uses and why)."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from egress import EgressProxy, Policy
from egress.boundary.checks import check_preparation, cut_mode_for
from egress.boundary.passing import listen_specs
from netcut.errors import ApplyFailed, InvalidInput
from netcut.helper.listeners import (
    BACKLOG,
    PROGRAM,
    FdPass,
    ListenRefused,
    ListenSpec,
    check_socket,
    parse_reply,
    spec_args,
)
from netcut.safety import CAP_NET_ADMIN, CAP_SYS_ADMIN
from netcut.targetref import parse_target

TCP = ListenSpec("tcp", "127.0.0.1", 0)
UDP_SAME = ListenSpec("udp", "127.0.0.1", 0, same_port=True)


@pytest.fixture
def fdpass() -> Iterator[FdPass]:
    with FdPass() as p:
        yield p


def run_program(path: str, specs: tuple[ListenSpec, ...]) -> subprocess.CompletedProcess[str]:
    """PROGRAM as the helper runs it: built-in modules only, no site, no environment."""
    argv = [sys.executable, "-I", "-S", "-c", PROGRAM, path, str(BACKLOG), *spec_args(specs)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)


def test_the_program_passes_listening_sockets(fdpass: FdPass) -> None:
    specs = (TCP, ListenSpec("tcp", "127.0.0.1", 0, fallback=True), TCP, UDP_SAME)
    done = run_program(fdpass.path, specs)
    assert done.returncode == 0, done.stderr
    socks = fdpass.receive(specs)
    try:
        ports = [s.getsockname()[1] for s in socks]
        assert ports[2] == ports[3]  # the DNS responder's UDP socket on its TCP port
        assert [s.type for s in socks] == [socket.SOCK_STREAM] * 3 + [socket.SOCK_DGRAM]
        assert all(not s.getblocking() for s in socks)
        with socket.create_connection(("127.0.0.1", ports[0]), timeout=5):
            pass  # it listens, here, although another process bound it
    finally:
        for s in socks:
            s.close()
    assert os.path.exists(fdpass.path)
    fdpass.close()
    assert not os.path.exists(fdpass.dir)


def test_a_taken_port_is_refused_or_falls_back(fdpass: FdPass) -> None:
    taken = socket.create_server(("127.0.0.1", 0))
    port = taken.getsockname()[1]
    try:
        fallback = ListenSpec("tcp", "127.0.0.1", port, fallback=True)
        assert run_program(fdpass.path, (fallback,)).returncode == 0
        (sock,) = fdpass.receive((fallback,))
        assert sock.getsockname()[1] not in (0, port)  # a forwarder moves to a free port
        sock.close()
    finally:
        taken.close()
    with FdPass() as second:
        taken = socket.create_server(("127.0.0.1", 0))
        fixed = (TCP, ListenSpec("tcp", "127.0.0.1", taken.getsockname()[1]))
        try:
            assert run_program(second.path, fixed).returncode == 0
            with pytest.raises(ListenRefused) as caught:
                second.receive(fixed)
        finally:
            taken.close()
    assert caught.value.errno == errno.EADDRINUSE
    assert caught.value.spec == fixed[1]


def test_receive_gives_up_when_nobody_connects(fdpass: FdPass) -> None:
    with pytest.raises(ApplyFailed, match="never connected"):
        fdpass.receive((TCP,), timeout=0.05)


def test_a_descriptor_that_is_not_the_socket_asked_for_is_refused(fdpass: FdPass) -> None:
    """A sender that is not the program (or a broken one) cannot slip in another socket:
    each descriptor must be what its spec asked for, and all are closed when one is not."""
    wrong = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    wrong.bind(("127.0.0.1", 0))
    port = wrong.getsockname()[1]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
        c.connect(fdpass.path)
        socket.send_fds(c, [f"ok {port}".encode()], [wrong.fileno()])
    with pytest.raises(ApplyFailed, match="is not that socket"):
        fdpass.receive((TCP,))
    wrong.close()


def test_the_directory_is_private_but_passable(fdpass: FdPass) -> None:
    assert os.stat(fdpass.dir).st_mode & 0o777 == 0o711
    assert os.stat(fdpass.path).st_mode & 0o777 == 0o666
    assert fdpass.mount_args() == ["-v", f"{fdpass.dir}:/netcut/pass"]


@pytest.mark.parametrize(
    "spec",
    [
        ListenSpec("tcp", "127.0.0.1,1", 1),
        ListenSpec("tcp", "", 1),
        ListenSpec("tcp", "127.0.0.1", 70000),
        ListenSpec("tcp", "127.0.0.1", -1),
    ],
)
def test_spec_args_refuses_what_the_program_could_not_carry(spec: ListenSpec) -> None:
    with pytest.raises(InvalidInput):
        spec_args((spec,))


def test_spec_args_counts() -> None:
    with pytest.raises(InvalidInput):
        spec_args(())
    with pytest.raises(InvalidInput, match="previous one's port"):
        spec_args((UDP_SAME,))
    assert spec_args((TCP, UDP_SAME)) == ["tcp,127.0.0.1,0,-", "udp,127.0.0.1,0,s"]


def test_parse_reply() -> None:
    assert parse_reply(b"ok 3128 15053", (TCP, UDP_SAME), 2) == (3128, 15053)
    with pytest.raises(ListenRefused) as caught:
        parse_reply(b"error 98 1", (TCP, UDP_SAME), 0)
    assert caught.value.errno == 98
    for bad, n in [
        (b"ok 3128", 0),  # no descriptors
        (b"ok 3128 1", 2),  # more ports than specs
        (b"ok 0", 1),
        (b"ok 99999999", 1),
        (b"error 98 5", 0),  # no such spec
        (b"error 98 0", 1),  # an error never carries descriptors
        (b"ok \xff", 1),
        (b"", 0),
    ]:
        with pytest.raises(ApplyFailed):
            parse_reply(bad, (TCP,), n)


@given(st.binary(max_size=200), st.integers(min_value=0, max_value=70))
def test_parse_reply_never_crashes(text: bytes, nfds: int) -> None:
    specs = (TCP, UDP_SAME)
    try:
        ports = parse_reply(text, specs, nfds)
    except (ApplyFailed, ListenRefused):
        return
    assert nfds == len(specs)
    assert len(ports) == len(specs)
    assert all(0 < p <= 65535 for p in ports)


def test_check_socket_wants_a_listening_tcp_socket() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        with pytest.raises(ApplyFailed):
            check_socket(s, TCP, s.getsockname()[1])  # bound, not listening
        s.listen()
        check_socket(s, TCP, s.getsockname()[1])
        with pytest.raises(ApplyFailed):
            check_socket(s, TCP, s.getsockname()[1] + 1)  # not where the reply says
        with pytest.raises(ApplyFailed):
            check_socket(s, ListenSpec("tcp", "::1", 0), s.getsockname()[1])


# ---------------------------------------------------------------- the boundary's choice

ROOT_CAPS = (1 << CAP_NET_ADMIN) | (1 << CAP_SYS_ADMIN)


@pytest.mark.parametrize(
    ("asked", "target", "caps", "mode", "needle"),
    [
        ("auto", "docker:box", ROOT_CAPS, "direct", "holds CAP_SYS_ADMIN"),
        ("auto", "docker:box", 0, "helper", "lacks CAP_SYS_ADMIN"),
        ("auto", "podman:box", 1 << CAP_NET_ADMIN, "helper", "helper container"),
        ("auto", "egt-ns", 0, "direct", "needs root"),
        ("auto", "containerd:k8s.io/x", 0, "direct", "docker and podman containers only"),
        ("direct", "docker:box", 0, "direct", "was asked for"),
        ("helper", "docker:box", ROOT_CAPS, "helper", "cut_mode='helper' was asked for"),
    ],
)
def test_decide(asked: str, target: str, caps: int, mode: str, needle: str) -> None:
    """The boundary's choice is netcut's (netcut.modes), in the boundary's words; a target
    with no helper is direct mode, which fails closed later, never a raise here."""
    how, why = cut_mode_for(asked, parse_target(target), caps)
    assert how == mode
    assert needle in why


def test_netcut_and_the_boundary_choose_alike() -> None:
    """One choice, two callers: for every container and capability set where netcut's CLI
    picks a mode, the boundary picks the same one."""
    from netcut.modes import decide

    for target in ("docker:box", "podman:box", "container:box"):
        for caps in (0, 1 << CAP_NET_ADMIN, 1 << CAP_SYS_ADMIN, ROOT_CAPS):
            ref = parse_target(target)
            assert cut_mode_for("auto", ref, caps)[0] == decide(ref, None, caps).mode


def _ask(**kw: object) -> object:
    args: dict[str, object] = {
        "framework_routes": (),
        "expect_blocked": (),
        "mode": "loopback",
        "proxy_port": 3128,
        "client_id": None,
        "token": None,
        "gateway": None,
        "force": False,
        "allow_privileged": False,
        "cut_mode": "helper",
        "helper_image": None,
        "transparent": False,
        "transparent_port": 15001,
        "dns_port": 15053,
        "socks_port": None,
    }
    return check_preparation("docker:box", Policy(), EgressProxy(Policy()), **{**args, **kw})  # type: ignore[arg-type]


def test_listen_specs_mirror_what_a_preparation_opens() -> None:
    ask = _ask(
        framework_routes=["http://127.0.0.1:8089/v1", "http://127.0.0.1:9000/"],
        transparent=True,
        socks_port=1080,
    )
    got = [(role, spec) for role, spec in listen_specs(ask, None)]  # type: ignore[arg-type]
    assert got == [
        (("main",), ListenSpec("tcp", "127.0.0.1", 3128)),
        (("forward", "127.0.0.1", 8089), ListenSpec("tcp", "127.0.0.1", 8089, fallback=True)),
        (("forward", "127.0.0.1", 9000), ListenSpec("tcp", "127.0.0.1", 9000, fallback=True)),
        (("transparent",), ListenSpec("tcp", "127.0.0.1", 15001)),
        (("dns",), ListenSpec("tcp", "127.0.0.1", 15053)),
        (("dns",), ListenSpec("udp", "127.0.0.1", 0, same_port=True)),
        (("socks",), ListenSpec("tcp", "127.0.0.1", 1080)),
    ]
    # a second prepare opens only what the first did not
    held = [("transparent", 15001), ("dns", 15053), ("socks5", 1080)]
    assert listen_specs(ask, None, held) == got[:3]  # type: ignore[arg-type]


def test_helper_mode_takes_loopback_now() -> None:
    ask = _ask()
    assert ask.cut_mode == "helper"  # type: ignore[attr-defined]
    assert ask.mode == "loopback"  # type: ignore[attr-defined]
    assert ask.cut_mode_reason == "cut_mode='helper' was asked for"  # type: ignore[attr-defined]


def test_a_gateway_that_is_not_ours_names_loopback_mode() -> None:
    """Rootless podman's gateway (slirp4netns, pasta) is no address of the host's namespace:
    the bind fails with EADDRNOTAVAIL, and the error says to use loopback mode. Nothing is
    sent anywhere: the bind itself fails."""
    import asyncio

    from egress import ExecutionNotReady, prepare_execution

    async def prepare() -> None:
        async with EgressProxy(Policy(), listen=()) as proxy:
            await prepare_execution(
                "egt-none-gw",
                Policy(),
                proxy,
                mode="gateway",
                gateway="198.18.255.254",
                cut_mode="direct",
            )

    with pytest.raises(ExecutionNotReady, match="use mode='loopback'") as caught:
        asyncio.run(prepare())
    assert "198.18.255.254" in str(caught.value)

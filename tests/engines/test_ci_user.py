"""The engine run's unprivileged user (tests/ciuser.py) is real: not root, no capabilities,
docker only through the group that owns the run's socket, rootless podman with slirp4netns,
and no way into a container's network namespace
(docs/testing.md#tests-as-the-runs-unprivileged-user).

Other tests build on this user to prove the unprivileged paths; these prove the user is what
a framework user is, so that a pass there means something."""

from __future__ import annotations

import json
import os
import pathlib
import socket
import stat

import pytest
from enginelib import BOX, sh

from ciuser import CiUser

# As the user: a container's network namespace, opened and then entered (setns, ctypes: the
# checkout's Python is 3.11, before os.setns); prints "open ERRNO" or "setns ERRNO" or "ok".
ENTER = """
import ctypes, os, sys
try:
    fd = os.open(sys.argv[1], os.O_RDONLY)
except OSError as exc:
    sys.exit(print("open", exc.errno))
libc = ctypes.CDLL(None, use_errno=True)
if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
    sys.exit(print("setns", ctypes.get_errno()))
print("ok")
"""


def _name(tag: str) -> str:
    return f"nc-u{os.getpid()}-{tag}"


def test_the_user_is_unprivileged_and_runs_this_checkout(
    ci_user: CiUser, ci_user_tmp: pathlib.Path
) -> None:
    assert ci_user.uid != 0
    ids = ci_user.run(["id", "-u"])
    assert ids.returncode == 0, ids.stderr
    assert ids.stdout.strip() == str(ci_user.uid)
    done = ci_user.python(
        "import os, netcut\n"
        "lines = open('/proc/self/status').read().splitlines()\n"
        "status = dict(line.split(':\\t') for line in lines)\n"
        "print(os.getuid(), os.geteuid(), status['CapEff'], status['CapPrm'], netcut.__file__)"
    )
    assert done.returncode == 0, done.stderr
    uid, euid, eff, prm, where = done.stdout.split()
    assert (int(uid), int(euid)) == (ci_user.uid, ci_user.uid)
    assert (int(eff, 16), int(prm, 16)) == (0, 0), "the user's process holds capabilities"
    checkout = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert where == os.path.join(checkout, "netcut", "__init__.py")
    # it writes where it owns, not in the checkout
    assert ci_user.run(["touch", f"{ci_user_tmp}/mine"]).returncode == 0
    assert (ci_user_tmp / "mine").stat().st_uid == ci_user.uid
    denied = ci_user.run(["touch", f"{checkout}/nc-user-was-here"])
    assert "Permission denied" in denied.stderr, denied.stderr


@pytest.mark.engine("docker")
def test_the_user_reaches_docker_only_through_the_sockets_group(ci_user: CiUser) -> None:
    sock = ci_user.env["DOCKER_HOST"].removeprefix("unix://")
    st = os.stat(sock)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, ci_user.group_gid, 0o660)
    argv = ["docker", "run", "--rm", "--name", _name("d"), "--network", "nc-ci", BOX]
    done = ci_user.run([*argv, "sh", "-c", "echo in-docker; busybox id -u"])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["in-docker", "0"]
    # the same user without its supplementary groups: the socket refuses it
    refused = ci_user.run(["docker", "version", "--format", "{{.Server.Version}}"], groups=False)
    assert refused.returncode != 0
    assert "permission denied" in refused.stderr.lower(), refused.stderr


@pytest.mark.engine("docker")
def test_the_user_cannot_open_a_docker_containers_network_namespace(ci_user: CiUser) -> None:
    name = _name("n")
    started = ci_user.run(["docker", "run", "-d", "--rm", "--name", name, BOX, "sleep", "600"])
    assert started.returncode == 0, started.stderr
    try:
        pid = sh("docker", "inspect", "-f", "{{.State.Pid}}", name).stdout.strip()
        netns = f"/proc/{pid}/ns/net"
        os.close(os.open(netns, os.O_RDONLY))  # there, and root can open it
        done = ci_user.python(ENTER, netns)
        assert done.stdout.split() == ["open", "13"], done.stdout + done.stderr  # EACCES
    finally:
        sh("docker", "rm", "-f", name, check=False)


@pytest.mark.engine("podman")
def test_the_user_runs_rootless_podman_on_slirp4netns(ci_user: CiUser) -> None:
    """The user's own podman: its store holds the box, a container runs in a user namespace
    mapped to the user's uid and subordinate ids, its network is slirp4netns (tap0, 10.0.2.x),
    and a published port carries a connection from the host's loopback into it."""
    with open("/etc/subuid") as f:
        ranges = [line.split(":") for line in f.read().split()]
    start, count = next((s, c) for n, s, c in ranges if n == ci_user.name)
    name = _name("p")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = ci_user.run([
        "podman", "run", "-d", "--rm", "--name", name, "-p", f"127.0.0.1:{port}:8080", BOX,
        "sh", "-c",
        "cat /proc/self/uid_map; busybox ip -4 -o addr show tap0; "
        "echo from-rootless | busybox nc -l -p 8080; sleep 600",
    ])  # fmt: skip
    assert started.returncode == 0, started.stderr
    try:
        info = json.loads(ci_user.run(["podman", "inspect", name]).stdout)[0]
        assert info["HostConfig"]["NetworkMode"] == "slirp4netns"
        # as the user, a connection to the published port until the container answers
        got = ci_user.python(CONNECT, str(port))
        assert got.stdout.strip() == "from-rootless", got.stdout + got.stderr
        logs = ci_user.run(["podman", "logs", name]).stdout.split("\n")
        assert logs[0].split() == ["0", str(ci_user.uid), "1"]
        assert logs[1].split() == ["1", start, count]
        assert logs[2].split()[1] == "tap0", logs[2]
        assert " 10.0.2." in logs[2], logs[2]
        # the container's process is the user's own; its namespace opens but cannot be entered
        pid = ci_user.run(["podman", "inspect", "-f", "{{.State.Pid}}", name]).stdout.strip()
        assert os.stat(f"/proc/{pid}").st_uid == ci_user.uid
        entered = ci_user.python(ENTER, f"/proc/{pid}/ns/net")
        assert entered.stdout.split() == ["setns", "1"], entered.stdout + entered.stderr  # EPERM
    finally:
        ci_user.run(["podman", "rm", "-f", "-t", "0", name])


# As the user: connect to 127.0.0.1:PORT until a line comes back (the port handler accepts
# before the container listens, and then closes at once), bounded.
CONNECT = """
import socket, sys, time
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    try:
        with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5) as s:
            line = s.makefile().readline()
    except OSError:
        line = ""
    if line:
        sys.exit(print(line.strip()))
    time.sleep(0.1)
sys.exit("no answer on the published port")
"""

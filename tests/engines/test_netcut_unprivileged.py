"""netcut as a docker-group user who is not root, on the real test dockerd (issue 30).

A real user (tests/unprivuser.py) in the group of the engine's socket runs `netcut` with no
option but the container: the mode is chosen for it (helper), the records go to a directory
of its own, and the cut leaves no working resolver. The container runs on the user-defined
network `nc-ci`, whose resolv.conf names Docker's embedded DNS (127.0.0.11, a DNAT in the
container's namespace to a socket of dockerd): before the fix a helper cut left it answering
(the host, not root, could not read the resolv.conf, so the plan had no reject for it) while
`status` said `cut`. Every DNS query here asks for the container's own name, which dockerd
answers itself: nothing is forwarded upstream, whatever the outcome.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator

import pytest
from enginelib import RUN_DIR, Box, sh

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))

from unprivuser import User, temporary_user

pytestmark = [pytest.mark.engine("docker")]


@pytest.fixture(scope="module")
def user() -> Iterator[User]:
    if os.geteuid() != 0:
        pytest.skip("creating a test user needs root")
    socket = os.environ.get("DOCKER_HOST", f"unix://{RUN_DIR}/docker.sock").removeprefix("unix://")
    with temporary_user(socket) as made:
        yield made


def resolvers(box: Box) -> list[str]:
    """The nameservers of the container's own resolv.conf (read as root, from the host)."""
    text = sh("docker", "exec", box.name, "cat", "/etc/resolv.conf").stdout
    return [line.split()[1] for line in text.splitlines() if line.startswith("nameserver")]


def answers(box: Box, server: str) -> bool:
    """Whether `server` answers a query for the container's own name, asked from inside."""
    done = sh(
        "docker", "exec", box.name, "busybox", "timeout", "5",
        "busybox", "nslookup", box.name, server,
        check=False, timeout=30,
    )  # fmt: skip
    return done.returncode == 0 and box.ip in done.stdout


def as_json(done: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert done.stdout.strip(), done.stderr
    data: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return data


def test_a_docker_group_user_cuts_with_the_helper_and_no_resolver_answers(
    user: User, make_box
) -> None:
    box = make_box("docker")
    servers = resolvers(box)
    assert servers == ["127.0.0.11"]
    assert all(answers(box, s) for s in servers)  # the check below can fail

    done = user.netcut("cut", "--container", box.name, "--json")
    data = as_json(done)
    assert done.returncode == 0, done.stderr
    assert data["mode"] == "helper"
    assert "lacks CAP_SYS_ADMIN" in str(data["mode_reason"])
    assert data["identity"] == list(_identity(box))
    probe = data["probe"]
    assert isinstance(probe, dict)
    assert probe["ok"]
    assert {i["target"]: i["outcome"] for i in probe["items"]} == {
        "127.0.0.11:53 (DNS)": "no answer"
    }

    assert not any(answers(box, s) for s in servers)
    # the record: in the user's own directory, keyed by the namespace, mode 0700
    directory = user.records()
    st = os.lstat(directory)
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (user.uid, 0o700)
    dev, ino = _identity(box)
    assert os.path.exists(os.path.join(directory, f"{dev}-{ino}.json"))

    done = user.netcut("status", "--container", box.name)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[0] == "cut"
    assert "mode: helper (chosen" in done.stdout

    done = user.netcut("restore", "--container", box.name, "--json")
    assert done.returncode == 0, done.stderr
    assert as_json(done)["result"] == "restored"
    assert all(answers(box, s) for s in servers)
    assert os.listdir(directory) == [".lock"]


def _identity(box: Box) -> tuple[int, int]:
    st = os.stat(box.netns)
    return st.st_dev, st.st_ino


def test_status_is_partial_while_a_resolver_is_not_refused_and_a_cut_closes_it(
    user: User, make_box, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record whose plan does not refuse 127.0.0.11 (what a helper cut made before the fix)
    and a backstop exactly as recorded: only the resolvers tell that the cut is not whole."""
    box = make_box("docker")
    assert user.netcut("cut", "--container", box.name).returncode == 0
    dev, ino = _identity(box)
    path = os.path.join(user.records(), f"{dev}-{ino}.json")
    with open(path) as f:
        record = json.loads(f.readline())
    for op in record["ops"]:
        if op["op"] == "AddBackstop":
            op["rules"] = [r for r in op["rules"] if r["dst"] != "127.0.0.11/32"]
    record["nameservers"] = []
    with open(path, "w") as f:
        f.write(json.dumps(record) + "\n")
    sh("nsenter", f"--net={box.netns}", "iptables-legacy", "-D", "NETCUT",
       "-d", "127.0.0.11/32", "-j", "REJECT")  # fmt: skip
    assert answers(box, "127.0.0.11")  # the hole is real

    done = user.netcut("status", "--container", box.name)
    assert done.returncode == 3, done.stdout + done.stderr
    assert done.stdout.splitlines()[0] == "partial"
    assert "DNS resolver 127.0.0.11 (loopback: an engine's embedded DNS) not refused" in done.stdout
    # direct mode (root reads the resolv.conf itself) judges the same record alike
    from netcut import api

    with monkeypatch.context() as m:
        m.setenv("NETCUT_STATE_DIR", user.records())
        direct = api.status(f"docker:{box.name}")
    assert direct.state == "partial"
    assert any("127.0.0.11" in line for line in direct.details)

    done = user.netcut("cut", "--container", box.name)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not answers(box, "127.0.0.11")
    assert user.netcut("status", "--container", box.name).stdout.splitlines()[0] == "cut"
    assert user.netcut("restore", "--container", box.name).returncode == 0


def test_restore_from_the_other_mode_and_gc_after_the_container_is_gone(
    user: User, make_box, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The helper's record is keyed by the namespace it saw: root in direct mode finds it in
    the same directory; `gc` as the user removes the record of a container removed while cut."""
    box = make_box("docker")
    identity = _identity(box)
    routes = box.routes()
    assert user.netcut("cut", "--container", box.name).returncode == 0
    monkeypatch.setenv("NETCUT_STATE_DIR", user.records())
    from netcut import api

    assert api.status(f"docker:{box.name}").state == "cut"
    assert api.restore(f"docker:{box.name}").changed
    assert box.routes_back_to(routes) == routes

    assert user.netcut("cut", "--container", box.name).returncode == 0
    # a live container's record stays, although the user cannot see who holds its namespace
    done = user.netcut("gc", "--json")
    assert (done.returncode, as_json(done)["removed"], as_json(done)["kept"]) == (0, [], 1)
    sh("docker", "rm", "-f", box.name)
    done = user.netcut("gc", "--json")
    assert done.returncode == 0, done.stderr
    assert as_json(done)["removed"] == ["{}-{}".format(*identity)]
    assert [n for n in os.listdir(user.records()) if n.endswith(".json")] == []


@pytest.mark.parametrize("shell", ["default", "ash", "dash"])
def test_the_probe_hears_a_resolver_that_answers(make_box, shell: str) -> None:
    """The helper's DNS probe, on a container that is not cut: 127.0.0.11 answers, and the
    probe says so (so its `no answer` after a cut means something), with each way the probe
    can send a query: bash's /dev/udp (default image, dash), busybox's `nc -u` (ash)."""
    from enginelib import shell_image

    from netcut.helper.session import HelperExecutor

    box = make_box("docker")
    image = None if shell == "default" else shell_image("docker", shell)
    with HelperExecutor("docker", box.name, image) as ex:
        ex.start()
        items = ex.probe_dns(("127.0.0.11",), box.name, 5.0)  # returns at the answer
    assert [(i.target, i.outcome, i.ok) for i in items] == [
        ("127.0.0.11:53 (DNS)", "connected", False)
    ]


def test_a_user_outside_the_engines_group_is_told_how_to_join() -> None:
    """The engine's socket refuses a user not in its group: the error says what to do."""
    with temporary_user() as outsider:
        done = outsider.netcut("status", "--container", "nc-no-such-box", "--runtime", "docker")
    assert done.returncode == 2
    assert "permission denied" in done.stderr
    assert "add it to the group that owns the socket" in done.stderr


def test_forget_finds_a_helper_cuts_record(user: User, make_box) -> None:
    """`CutResult.identity` is set in helper mode, so `forget` (what release_execution(
    forget=True) calls) removes the record; it was None, and the record stayed."""
    box = make_box("docker")
    code = (
        "import netcut\n"
        "from netcut.helper import mode\n"
        f"r = mode.cut(netcut.container({box.name!r}))\n"
        "print(list(r.identity), netcut.forget(r.identity), netcut.forget(r.identity))\n"
    )
    done = user.python(code)
    assert done.returncode == 0, done.stderr
    dev, ino = _identity(box)
    assert done.stdout.split() == [f"[{dev},", f"{ino}]", "True", "False"]
    assert [n for n in os.listdir(user.records()) if n.endswith(".json")] == []

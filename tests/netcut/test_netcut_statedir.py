"""The record directory of a user who is not root, as a real such user (tests/unprivuser.py):
created per user, mode 0700, checked before use, and every refusal names the fix
(docs/netcut.md#state-directory-errors). Records from another boot are stale."""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))

from unprivuser import User, temporary_user

from netcut.plan.planner import CutPlan
from netcut.records import Store

pytestmark = pytest.mark.netns  # creating a user needs root

FORGET = "import netcut; print(netcut.forget((1, 2)))"


@pytest.fixture(scope="module")
def user() -> Iterator[User]:
    with temporary_user() as made:
        yield made


@pytest.fixture
def fresh(user: User) -> Iterator[str]:
    directory = user.records()
    shutil.rmtree(directory, ignore_errors=True)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def test_a_user_gets_a_private_directory_of_its_own(user: User, fresh: str) -> None:
    done = user.python(FORGET)
    assert (done.returncode, done.stdout.strip()) == (0, "False"), done.stderr
    st = os.lstat(fresh)
    assert (st.st_uid, stat.S_IMODE(st.st_mode), stat.S_ISDIR(st.st_mode)) == (
        user.uid,
        0o700,
        True,
    )


@pytest.mark.parametrize(
    ("owner", "mode", "said"),
    [("root", 0o700, "is owned by uid 0"), ("user", 0o755, "is open to others (mode 0755")],
)
def test_a_directory_someone_else_could_write_is_refused(
    user: User, fresh: str, owner: str, mode: int, said: str
) -> None:
    os.mkdir(fresh, mode)
    os.chmod(fresh, mode)
    if owner == "user":
        os.chown(fresh, user.uid, user.gid)
    done = user.python(FORGET)
    assert done.returncode == 1
    assert "StateError" in done.stderr
    assert said in done.stderr
    assert "set $NETCUT_STATE_DIR to a directory of your own" in done.stderr


def test_a_symlink_in_its_place_is_refused(user: User, fresh: str) -> None:
    target = tempfile.mkdtemp()
    try:
        os.chown(target, user.uid, user.gid)
        os.symlink(target, fresh)
        done = user.python(FORGET)
        assert "is not a directory (a symlink?)" in done.stderr
    finally:
        os.unlink(fresh)
        shutil.rmtree(target)


def test_xdg_runtime_dir_first(user: User, fresh: str) -> None:
    runtime = tempfile.mkdtemp()
    try:
        os.chown(runtime, user.uid, user.gid)
        done = user.python(FORGET, env={"XDG_RUNTIME_DIR": runtime})
        assert done.returncode == 0, done.stderr
        assert os.path.isdir(os.path.join(runtime, "netcut"))
        assert not os.path.exists(fresh)
    finally:
        shutil.rmtree(runtime)


def test_roots_directory_is_refused_with_the_fix(user: User) -> None:
    """What a docker-group user met first: root's /run/netcut, no hint."""
    root_dir = tempfile.mkdtemp()
    try:
        done = user.python(FORGET, env={"NETCUT_STATE_DIR": root_dir})
        assert "cannot open its lock file for writing: Permission denied" in done.stderr
        assert "set $NETCUT_STATE_DIR to a directory of your own" in done.stderr
    finally:
        shutil.rmtree(root_dir)


def test_cutting_a_namespace_without_privileges_names_the_fix(user: User) -> None:
    done = user.netcut("cut", "--netns-path", "/proc/1/ns/net", "--json")
    assert done.returncode == 2
    error = json.loads(done.stdout)["error"]
    assert "needs root or CAP_SYS_ADMIN + CAP_NET_ADMIN" in error
    assert "--container ID" in error


def test_a_record_of_another_boot_is_stale(tmp_path: object) -> None:
    store = Store(str(tmp_path), "4-4026532001")
    store.save(CutPlan((), ()), {"target": "x"})
    assert store.load() == CutPlan((), ())
    with open(store.path) as f:
        data = json.loads(f.readline())
    assert data["meta"]["boot"]  # this boot's id, from the kernel
    data["meta"]["boot"] = "00000000-0000-0000-0000-000000000000"
    with open(store.path, "w") as f:
        f.write(json.dumps(data) + "\n")
    assert store.load() is None


def test_a_namespace_a_user_cannot_enter_names_the_fix(user: User) -> None:
    """egress's listener inside a namespace, as a user who is not root (what verifiers'
    runtime met: `NamespaceError: ... Permission denied` and nothing more)."""
    code = (
        "import egress\n"
        "try:\n"
        "    egress.listen_in_netns('/proc/1/ns/net', '127.0.0.1', 0)\n"
        "except egress.NamespaceError as exc:\n"
        "    print(exc)\n"
    )
    done = user.python(code)
    assert "Permission denied" in done.stdout, done.stderr
    assert 'cut_mode="helper"' in done.stdout


def test_a_gateway_that_is_not_here_names_rootless_podman() -> None:
    import errno

    from egress.proxy.net.listener import listen_socket

    with pytest.raises(OSError, match="rootless podman") as caught:
        listen_socket("198.18.255.254", 0)  # on no interface of this namespace
    assert caught.value.errno == errno.EADDRNOTAVAIL

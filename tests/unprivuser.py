"""Real users that are not root, for the tests of the unprivileged path
(docs/user-guide.md#helper-mode): the framework process of someone who runs evaluations as a
member of the `docker` group, or with rootless podman, never as root.

Unprivileged paths are tested by a real non-root user, never a monkeypatch as root: the
process runs under that uid with no capability, so the record directory's owner and mode,
/proc's permissions, setns, the container's resolv.conf and the helper's fd passing are the
kernel's to allow or refuse.

- `temporary_user(socket)`: a user with no home (netcut's default record directory,
  /tmp/netcut-UID, is what it gets), in the group of `socket` when one is given.
- `docker_group_user(socket)`: a user with a home of its own (and NETCUT_STATE_DIR in it), in
  the group of the test engines' docker socket.

Each is removed afterwards, with everything it left. When the socket's group is root's, the
socket is lent to a group made for the test and given back (never add a user to root's
group). Commands run through `setpriv` with a clean environment and the system's `python3`
(the test's interpreter may live where the user cannot go: pyenv or a venv under /root),
importing this checkout and the test venv's packages. This is the one fixture module for
such users, kept small. Rootless podman is the engine run's permanent user's
(tests/engines/up.sh): subordinate ids and storage made once per run.
"""

from __future__ import annotations

import contextlib
import grp
import itertools
import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this checkout
RUN_DIR = os.environ.get("NETCUT_CI_RUN", "/run/netcut-ci")  # the test engines' (enginelib)
SYSTEM_PYTHON = "/usr/bin/python3"
NO_HOME = "/nonexistent"
_made = itertools.count(1)  # users made by this process: each name is new


def _sh(*argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(argv)}: {done.stderr.strip() or done.stdout.strip()}")
    return done


def _python() -> str:
    """An interpreter any user may run, of this one's version (so the venv's packages load)."""
    for candidate in (
        SYSTEM_PYTHON,
        f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}",
    ):
        if not os.path.exists(candidate):
            continue
        done = subprocess.run(
            [candidate, "-c", "import sys; print(sys.version_info[:2])"],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.stdout.strip() == str(tuple(sys.version_info[:2])):
            return candidate
    return sys.executable


@dataclass(frozen=True)
class User:
    """A temporary user: its name, ids, the engine socket's group it is a member of, a home
    (NO_HOME: none) and the record directory it is given (None: netcut's default)."""

    name: str
    uid: int
    gid: int
    group: str = ""
    home: str = NO_HOME
    # variables of its own that replace the test run's (rootless podman's configuration)
    own_env: tuple[tuple[str, str], ...] = ()
    state_dir: str | None = None

    def argv(self, *command: str) -> list[str]:
        """`command` run as this user: its uid, its groups, no capability at all."""
        return [
            "setpriv",
            f"--reuid={self.uid}",
            f"--regid={self.gid}",
            "--init-groups",
            "--inh-caps=-all",
            "--",
            *command,
        ]

    def env(self, path: str | None = None, site: list[str] | None = None) -> dict[str, str]:
        """A user's environment: its home, the test engines' clients and configuration, the
        checkout importable by the system's interpreter (with `site`, a venv's
        site-packages, else this one's); nothing of root's."""
        if site is None:
            site = [sysconfig.get_paths()["purelib"]]
        keep = (
            "DOCKER_HOST",
            "CONTAINERS_CONF",
            "CONTAINERS_STORAGE_CONF",
            "LANG",
            "NETCUT_HELPER_IMAGE",
        )
        env = {k: os.environ[k] for k in keep if os.environ.get(k)}
        env.update(
            HOME=self.home,
            USER=self.name,
            PATH=path or os.environ.get("PATH", "/usr/bin:/bin"),
            PYTHONPATH=os.pathsep.join([ROOT, *site]),
            PYTHONDONTWRITEBYTECODE="1",
        )
        if self.state_dir is not None:
            env["NETCUT_STATE_DIR"] = self.state_dir
        env.update(self.own_env)
        return env

    def run(
        self, *argv: str, env: dict[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """`argv` as this user, in a clean environment (`env` added to the user's own)."""
        full = {**self.env(), **(env or {})}
        command = self.argv("env", "-i", *(f"{k}={v}" for k, v in full.items()), *argv)
        return subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, check=False, cwd="/"
        )

    def netcut(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """`netcut ARGS` as this user."""
        return self.run(_python(), "-m", "netcut.cli", *args, env=env, timeout=timeout)

    def python(
        self, code: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """`python3 -c CODE` as this user, with this checkout importable."""
        return self.run(_python(), "-c", code, env=env)

    def records(self) -> str:
        """Its record directory: the one it is given, else netcut's default for a user with
        no $XDG_RUNTIME_DIR."""
        return self.state_dir or os.path.join(tempfile.gettempdir(), f"netcut-{self.uid}")


@contextlib.contextmanager
def _lent_group(socket_path: str, tag: str) -> Iterator[str]:
    """The group of `socket_path`; a group made for the test when it is root's (the socket
    lent to it, and given back afterwards)."""
    st = os.stat(socket_path)
    if st.st_gid != 0:
        yield grp.getgrgid(st.st_gid).gr_name
        return
    made = f"ncug{tag}"
    with contextlib.ExitStack() as undo:
        _sh("groupadd", made)
        undo.callback(_sh, "groupdel", made, check=False)
        shutil.chown(socket_path, group=made)
        undo.callback(os.chown, socket_path, st.st_uid, st.st_gid)
        os.chmod(socket_path, st.st_mode | 0o060)
        undo.callback(os.chmod, socket_path, st.st_mode & 0o7777)
        yield made


@contextlib.contextmanager
def temporary_user(socket: str | None = None) -> Iterator[User]:
    """A new user with no home (in the group that owns `socket`, the engine's), removed
    afterwards with its default record directory."""
    tag = f"{os.getpid() % 100000}x{next(_made)}"
    name = f"ncu{tag}"
    with contextlib.ExitStack() as undo:
        group = undo.enter_context(_lent_group(socket, tag)) if socket is not None else ""
        groups = ["--groups", group] if group else []
        _sh("useradd", "--no-create-home", "--home-dir", NO_HOME, "--shell",
            "/usr/sbin/nologin", "--user-group", *groups, name)  # fmt: skip
        undo.callback(_sh, "userdel", name, check=False)
        entry = pwd.getpwnam(name)
        default = os.path.join(tempfile.gettempdir(), f"netcut-{entry.pw_uid}")
        undo.callback(shutil.rmtree, default, ignore_errors=True)
        yield User(name, entry.pw_uid, entry.pw_gid, group)


@contextlib.contextmanager
def docker_group_user(socket_path: str = f"{RUN_DIR}/docker.sock") -> Iterator[User]:
    """A new user with a home and a record directory of its own, in the group of
    `socket_path`, removed (with any group made for it, the socket's group restored)
    whatever the outcome."""
    tag = f"{os.getpid() % 100000}x{next(_made)}"
    name = f"ncu{tag}"
    with contextlib.ExitStack() as undo:
        group = undo.enter_context(_lent_group(socket_path, tag))
        home = tempfile.mkdtemp(prefix=f"{name}-")
        undo.callback(shutil.rmtree, home, ignore_errors=True)
        _sh("useradd", "-M", "-d", home, "-s", "/bin/sh", "-G", group, name)
        undo.callback(_sh, "userdel", name, check=False)
        entry = pwd.getpwnam(name)
        os.chown(home, entry.pw_uid, entry.pw_gid)
        os.chmod(home, 0o700)
        state = os.path.join(home, "netcut")
        os.makedirs(state, mode=0o700)
        os.chown(state, entry.pw_uid, entry.pw_gid)
        yield User(name, entry.pw_uid, entry.pw_gid, group, home, state_dir=state)

"""A real user that is not root, for the tests of netcut's unprivileged path: a member of the
group that owns the test dockerd's socket (a "docker-group user", as framework users are).

Unprivileged paths are tested by a real non-root user, never a monkeypatch as root: the
record directory's owner and mode, /proc's permissions and the container's resolv.conf are
only what they are for such a user. `temporary_user()` creates one (useradd, no home, no
login shell) and removes it and everything it left in /tmp afterwards; when the socket's group
is root's, the socket is lent to a group of the test's own and given back. It is small on
purpose: the engine run's permanent user (tests/engines/up.sh) can replace it.

Commands run as the user through `setpriv` with a clean environment, with the system's
`python3` (the test's own interpreter may live where the user cannot go: pyenv under /root)
importing this checkout and the test venv's packages.
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
from dataclasses import dataclass, field

_made = itertools.count(1)
_CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python() -> str:
    """An interpreter any user may run, of this one's version (so the venv's packages load)."""
    for candidate in (
        "/usr/bin/python3",
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


@dataclass
class User:
    name: str
    uid: int
    gid: int
    env: dict[str, str] = field(default_factory=dict)

    def run(
        self, *argv: str, env: dict[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """`argv` as this user, in a clean environment (`env` added to the user's own)."""
        full = {**self.env, **(env or {})}
        command = [
            "setpriv",
            f"--reuid={self.uid}",
            f"--regid={self.gid}",
            "--init-groups",
            "env",
            "-i",
            *(f"{k}={v}" for k, v in full.items()),
            *argv,
        ]
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
        """Its default record directory when it has no $XDG_RUNTIME_DIR."""
        return os.path.join(tempfile.gettempdir(), f"netcut-{self.uid}")


@contextlib.contextmanager
def temporary_user(socket: str | None = None) -> Iterator[User]:
    """A new user (in the group that owns `socket`, the engine's), removed afterwards."""
    name = f"ncu{os.getpid() % 100000}x{next(_made)}"
    st = os.stat(socket) if socket is not None else None
    lent_group = None
    if socket is not None and st is not None and st.st_gid == 0:
        # never add a user to root's group: lend the socket to a group of our own
        lent_group = f"{name}g"
        subprocess.run(["groupadd", lent_group], check=True)
        shutil.chown(socket, group=lent_group)
        os.chmod(socket, st.st_mode | 0o060)
    groups = []
    if st is not None:
        groups = ["--groups", lent_group or grp.getgrgid(st.st_gid).gr_name]
    subprocess.run(
        [
            "useradd",
            "--no-create-home",
            "--home-dir",
            "/nonexistent",
            "--shell",
            "/usr/sbin/nologin",
            "--user-group",
            *groups,
            name,
        ],
        check=True,
    )
    try:
        entry = pwd.getpwnam(name)
        site = sysconfig.get_paths()["purelib"]
        path = os.environ.get("PATH", "/usr/bin:/bin")
        env = {
            "PATH": path,
            "HOME": "/nonexistent",
            "PYTHONPATH": os.pathsep.join([_CHECKOUT, site]),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        for key in ("DOCKER_HOST", "NETCUT_HELPER_IMAGE"):
            if os.environ.get(key):
                env[key] = os.environ[key]
        yield User(name, entry.pw_uid, entry.pw_gid, env)
    finally:
        with contextlib.suppress(KeyError):
            uid = pwd.getpwnam(name).pw_uid
            shutil.rmtree(os.path.join(tempfile.gettempdir(), f"netcut-{uid}"), ignore_errors=True)
        subprocess.run(["userdel", name], check=False, capture_output=True)
        if lent_group is not None and socket is not None and st is not None:
            os.chown(socket, st.st_uid, st.st_gid)
            os.chmod(socket, st.st_mode)
            subprocess.run(["groupdel", lent_group], check=False, capture_output=True)

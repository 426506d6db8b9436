"""A real non-root user in the group that owns the test run's docker socket, made for a test and
removed after it (docs/testing.md#unprivileged-users): the framework process of a user who runs
evaluations as a member of the `docker` group, never root. Nothing stands in for the missing
privileges: the process runs under that uid with no capability, so /proc permissions, setns,
the state directory and the helper's fd passing are the kernel's to allow or refuse.

The socket's group is used as it is when it is not root's; else a temporary group is made and
the socket's group restored afterwards. The interpreter is the system's (/usr/bin/python3):
the project's venv interpreter may live under /root, which a user cannot enter; the worktree
and the venv's site-packages go on PYTHONPATH.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

from enginelib import RUN_DIR, sh

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SYSTEM_PYTHON = "/usr/bin/python3"


@dataclass(frozen=True)
class User:
    """A temporary user: its name, ids, a home and a state directory of its own."""

    name: str
    uid: int
    gid: int
    group: str  # the docker socket's group, which it is a member of
    home: str

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
        worktree importable by the system's interpreter (with `site`, a venv's
        site-packages, else this one's); nothing of root's."""
        if site is None:
            site = [p for p in sys.path if p.endswith("site-packages") and p.startswith(ROOT)]
        keep = ("DOCKER_HOST", "CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF", "LANG")
        env = {k: os.environ[k] for k in keep if k in os.environ}
        env.update(
            HOME=self.home,
            USER=self.name,
            PATH=path or os.environ["PATH"],
            PYTHONPATH=os.pathsep.join([ROOT, *site]),
            NETCUT_STATE_DIR=os.path.join(self.home, "netcut"),
            PYTHONDONTWRITEBYTECODE="1",
        )
        return env


@contextlib.contextmanager
def docker_group_user(socket_path: str = f"{RUN_DIR}/docker.sock") -> Iterator[User]:
    """A new user in the group of `socket_path`, removed (with any group made for it, the
    socket's group restored) whatever the outcome."""
    tag = f"{os.getpid() % 100000}"
    name = f"ncu{tag}"
    st = os.stat(socket_path)
    made_group = None
    with contextlib.ExitStack() as undo:
        if st.st_gid == 0:
            made_group = f"ncug{tag}"
            sh("groupadd", made_group)
            undo.callback(sh, "groupdel", made_group, check=False)
            shutil.chown(socket_path, group=made_group)
            undo.callback(os.chown, socket_path, st.st_uid, st.st_gid)
            os.chmod(socket_path, st.st_mode | 0o060)
            undo.callback(os.chmod, socket_path, st.st_mode & 0o7777)
        group = made_group or grp.getgrgid(st.st_gid).gr_name
        home = tempfile.mkdtemp(prefix=f"{name}-")
        undo.callback(shutil.rmtree, home, ignore_errors=True)
        sh("useradd", "-M", "-d", home, "-s", "/bin/sh", "-G", group, name)
        undo.callback(sh, "userdel", name, check=False)
        entry = pwd.getpwnam(name)
        os.chown(home, entry.pw_uid, entry.pw_gid)
        os.chmod(home, 0o700)
        os.makedirs(os.path.join(home, "netcut"), mode=0o700)
        os.chown(os.path.join(home, "netcut"), entry.pw_uid, entry.pw_gid)
        yield User(name, entry.pw_uid, entry.pw_gid, group, home)

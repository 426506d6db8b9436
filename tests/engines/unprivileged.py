"""A real non-root user in the group that owns the test run's docker socket, made for a test and
removed after it (docs/user-guide.md#helper-mode): the framework process of a user who runs
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
import itertools
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

from enginelib import RUN_DIR, sh

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SYSTEM_PYTHON = "/usr/bin/python3"
_made = itertools.count(1)  # users made by this process: each name is new


@dataclass(frozen=True)
class User:
    """A temporary user: its name, ids, a home and a state directory of its own."""

    name: str
    uid: int
    gid: int
    group: str  # the docker socket's group, which it is a member of
    home: str
    # variables of its own that replace the test run's (rootless podman's configuration)
    own_env: tuple[tuple[str, str], ...] = ()

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
        env.update(self.own_env)
        return env


@contextlib.contextmanager
def docker_group_user(socket_path: str = f"{RUN_DIR}/docker.sock") -> Iterator[User]:
    """A new user in the group of `socket_path`, removed (with any group made for it, the
    socket's group restored) whatever the outcome."""
    tag = f"{os.getpid() % 100000}x{next(_made)}"
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


# Rootless podman: its own configuration, storage (vfs: no kernel overlay in a user
# namespace needed) and runtime directory in the user's home; slirp4netns networking; no
# cgroups of its own on a cgroup v1 host (cgroupfs, events to a file: no systemd).
_ROOTLESS_CONF = """[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
[containers]
netns = "slirp4netns"
"""
SUBID_BASE = 400000
SUBID_COUNT = 65536


@contextlib.contextmanager
def rootless_podman_user(image: str) -> Iterator[User]:
    """A new user with subordinate ids and a rootless podman of its own, holding `image`
    (copied from the test run's root podman with `save` and `load`: nothing is pulled).
    Everything is removed after: its processes (by pid), its storage, its subordinate ids."""
    tag = f"{os.getpid() % 100000}x{next(_made)}"
    name = f"ncr{tag}"
    with contextlib.ExitStack() as undo:
        home = tempfile.mkdtemp(prefix=f"{name}-")
        undo.callback(shutil.rmtree, home, ignore_errors=True)
        sh("useradd", "-M", "-d", home, "-s", "/bin/sh", name)
        undo.callback(sh, "userdel", name, check=False)
        entry = pwd.getpwnam(name)
        base = SUBID_BASE + ((os.getpid() + next(_made)) % 64) * SUBID_COUNT
        for path in ("/etc/subuid", "/etc/subgid"):
            line = f"{name}:{base}:{SUBID_COUNT}\n"
            with open(path, "a") as f:
                f.write(line)
            undo.callback(_drop_line, path, line)
        undo.callback(_kill_user_processes, entry.pw_uid)
        own = _rootless_files(home, entry.pw_uid, entry.pw_gid)
        user = User(name, entry.pw_uid, entry.pw_gid, "", home, own)
        tar = os.path.join(home, "image.tar")
        sh("podman", "save", "-o", tar, image, timeout=300)
        os.chown(tar, entry.pw_uid, entry.pw_gid)
        done = subprocess.run(
            user.argv("podman", "load", "-i", tar),
            env=user.env(),
            cwd=home,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        yield user


def _rootless_files(home: str, uid: int, gid: int) -> tuple[tuple[str, str], ...]:
    run = os.path.join(home, "run")
    for d in (run, os.path.join(home, "cfg"), os.path.join(home, "netcut")):
        os.makedirs(d, mode=0o700)
    conf = os.path.join(home, "cfg", "containers.conf")
    storage = os.path.join(home, "cfg", "storage.conf")
    with open(conf, "w") as f:
        f.write(_ROOTLESS_CONF)
    with open(storage, "w") as f:
        f.write(
            f'[storage]\ndriver = "vfs"\ngraphroot = "{home}/storage"\nrunroot = "{run}/storage"\n'
        )
    for top, dirs, files in os.walk(home):
        for n in (top, *(os.path.join(top, x) for x in dirs + files)):
            os.chown(n, uid, gid)
    return (
        ("XDG_RUNTIME_DIR", run),
        ("CONTAINERS_CONF", conf),
        ("CONTAINERS_STORAGE_CONF", storage),
        ("PATH", "/usr/bin:/bin:/usr/sbin:/sbin"),  # the system's podman, not the run's
    )


def _drop_line(path: str, line: str) -> None:
    with open(path) as f:
        kept = [x for x in f.readlines() if x != line]
    with open(path, "w") as f:
        f.writelines(kept)


def _kill_user_processes(uid: int) -> None:
    """Each process of the temporary user (podman's pause process, conmon, slirp4netns, the
    containers), by pid."""
    import signal

    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid == uid:
                os.kill(int(entry), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            continue

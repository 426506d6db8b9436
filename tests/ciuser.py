"""The engine run's unprivileged user: a real non-root account, made by tests/engines/up.sh.

Framework users run the evaluation as a normal user in the `docker` group, or with rootless
podman, never as root. up.sh creates `NETCUT_CI_NAME-user` (default `netcut-ci-user`) for
each engine run: a member of the group that owns the run's docker socket (dockerd `--group`),
with subordinate id ranges of its own and a rootless podman (storage in the run's data
directory, XDG_RUNTIME_DIR in its run directory, slirp4netns networking) holding the test
image. down.sh removes it with everything it added.

Tests run commands as that user with `CiUser.run` (the `ci_user` and `run_as_user` fixtures
of tests/conftest.py): a process with the user's uid, gid and groups and no capabilities, in
the user's environment only (docs/testing.md#tests-as-the-runs-unprivileged-user). Nothing
stands in for the missing privileges: what fails for the user fails here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

REQUIRE_ENV = "EGRESS_REQUIRE_ENGINE"  # the user comes and goes with the engine run


@dataclass(frozen=True)
class CiUser:
    """The run's unprivileged user and the environment its commands get."""

    name: str
    uid: int
    gid: int
    group: str  # owns the run's docker socket: the "docker group" this user is in
    group_gid: int
    home: str
    env: Mapping[str, str]  # HOME, PATH, XDG_RUNTIME_DIR, DOCKER_HOST, CONTAINERS_*, ...

    def run(
        self,
        argv: Sequence[str],
        *,
        input: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float = 120,
        groups: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """Run `argv` as the user (stdout and stderr captured, text; never raises on a
        non-zero exit). `env` adds to or overrides the user's environment; `groups=False`
        runs it without its supplementary groups (so without the docker group)."""
        return subprocess.run(
            self.argv(argv, env=env, groups=groups),
            input=input,
            capture_output=True,
            text=True,
            cwd=cwd or self.home,
            timeout=timeout,
            check=False,
        )

    def argv(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, groups: bool = True
    ) -> list[str]:
        """The command line that runs `argv` as the user, as `run` does (for a process the
        test talks to while it runs, e.g. with asyncio.create_subprocess_exec)."""
        full_env = {**self.env, **(env or {})}
        return [
            "setpriv",
            f"--reuid={self.uid}",
            f"--regid={self.gid}",
            "--init-groups" if groups else "--clear-groups",
            "--inh-caps=-all",
            "env",
            "-i",
            *(f"{k}={v}" for k, v in full_env.items()),
            *argv,
        ]

    def python(
        self, code: str, *args: str, timeout: float = 120, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a Python snippet as the user with this checkout's interpreter (its venv, so
        `egress` and `netcut` import from this checkout)."""
        return self.run([sys.executable, "-c", code, *args], timeout=timeout, env=env)


def _exports(path: str) -> dict[str, str]:
    """NAME=VALUE pairs of a file of lines `[export ]NAME=VALUE` (no quoting, no expansion)."""
    found: dict[str, str] = {}
    with open(path) as f:
        for line in f.read().splitlines():
            name, sep, value = line.removeprefix("export ").partition("=")
            if sep and name.isidentifier():
                found[name] = value
    return found


def load(run_dir: str | None = None) -> CiUser | str:
    """The run's user, or why there is none (no engine run, or not root to switch to it)."""
    import grp
    import pwd

    run_dir = run_dir or os.environ.get("NETCUT_CI_RUN", "/run/netcut-ci")
    if os.geteuid() != 0:
        return "running as the run's user needs root (setpriv)"
    try:
        run_env = _exports(f"{run_dir}/env")
        user_env = _exports(f"{run_dir}/user/env")
    except OSError as exc:
        return f"no engine run with a user in {run_dir} (tests/engines/up.sh): {exc}"
    name, group = run_env.get("NETCUT_CI_USER"), run_env.get("NETCUT_CI_GROUP")
    if not name or not group:
        return f"{run_dir}/env names no user (a run of an up.sh that made none)"
    try:
        pw, gr = pwd.getpwnam(name), grp.getgrnam(group)
    except KeyError as exc:
        return f"the run's user or group does not exist: {exc}"
    # the checkout's console scripts (egress, netcut) first on the user's PATH
    bin_dir = os.path.dirname(sys.executable)
    user_env["PATH"] = f"{bin_dir}:{user_env.get('PATH', '/usr/bin:/bin')}"
    return CiUser(name, pw.pw_uid, pw.pw_gid, group, gr.gr_gid, pw.pw_dir, user_env)

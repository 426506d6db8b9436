"""Tests that need a network namespace but not root: each runs in a user namespace of its own.

A test marked `userns` is collected as a `UsernsRun` item in its place: it runs that one test
in a fresh pytest process under `unshare --user --map-root-user --net --mount`, where the
test is root over namespaces it creates itself (test hosts, veths, netcut's cut) and nothing
else. `/run` is a tmpfs of that mount namespace, so `ip netns add` and the xtables lock
work there and nothing of this host's `/run` is seen or changed. It runs this way whoever
runs the suite, root or not, so CI proves each such test needs no root
(docs/testing.md#which-tests-need-root).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

INNER = "EGRESS_USERNS_INNER"
# `/run` of the new mount namespace: a tmpfs, with the directory `ip netns` mounts under; the
# new network namespace's loopback up, as the host's is
SETUP = (
    "mount -t tmpfs -o mode=0755 egress-userns /run && mkdir /run/netns && "
    'ip link set lo up && exec "$@"'
)
UNSHARE = ["unshare", "--user", "--map-root-user", "--net", "--mount", "--propagation", "private"]
INNER_TIMEOUT = 120  # pytest-timeout's default for the inner test (pyproject.toml)
# An agent without capabilities, in no set: the prefix of a command a sandbox runs. A user
# namespace maps only its creator's uid (as 0), so the agent keeps uid 0 there; with no
# capability that uid can change nothing of the namespace's network (netcut's own safety
# scan, which looks at capabilities, finds nothing to refuse).
CAPLESS = ["setpriv", "--inh-caps=-all", "--bounding-set=-all", "--"]


def inner() -> bool:
    """True in the pytest process that runs inside the user namespace."""
    return os.environ.get(INNER) == "1"


@functools.cache
def available() -> str | None:
    """Why user namespaces cannot be made here, or None when they can."""
    try:
        done = subprocess.run(
            [*UNSHARE, "sh", "-c", SETUP, "sh", "ip", "netns", "add", "probe"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except OSError as err:
        return f"unshare: {err}"
    if done.returncode != 0:
        return f"unprivileged user namespaces are not available: {done.stderr.strip()}"
    return None


class UsernsFailed(Exception):
    """The inner run failed: its output is the report."""


class UsernsRun(pytest.Item):
    """One test run in a user namespace of its own (a fresh pytest process)."""

    def __init__(self, *, original: pytest.Item, **kw: Any) -> None:
        super().__init__(**kw)
        self.original = original
        self.own_markers = list(original.own_markers)
        limit = original.get_closest_marker("timeout")
        self.inner_timeout = float(limit.args[0]) if limit and limit.args else INNER_TIMEOUT
        # the inner process's collection and start-up on top of the test's own limit
        self.add_marker(pytest.mark.timeout(self.inner_timeout + 60), append=False)

    def runtest(self) -> None:
        why = available()
        if why is not None:
            if os.environ.get("EGRESS_REQUIRE_NETNS") == "1":
                pytest.fail(f"EGRESS_REQUIRE_NETNS=1 but {why}", pytrace=False)
            pytest.skip(why)
        # pytest's own /tmp/pytest-of-<user> would be another user's there (uid 0 is ours)
        basetemp = tempfile.mkdtemp(prefix="egress-userns-")
        argv = [*UNSHARE, "sh", "-c", SETUP, "sh", sys.executable, "-m", "pytest"]
        argv += [self.nodeid, "-q", "-p", "no:cacheprovider", "--no-header"]
        argv += ["--basetemp", basetemp]
        env = {**os.environ, INNER: "1", "EGRESS_REQUIRE_NETNS": "1"}
        try:
            done = subprocess.run(
                argv,
                cwd=self.config.rootpath,
                env=env,
                capture_output=True,
                text=True,
                timeout=self.inner_timeout + 50,
                check=False,
            )
        finally:
            shutil.rmtree(basetemp, ignore_errors=True)
        summary = done.stdout.strip().splitlines()[-1:] or [""]
        # exactly this one test ran and passed: not skipped, not deselected
        if done.returncode != 0 or not re.fullmatch(r"=* ?1 passed.*", summary[0]):
            raise UsernsFailed(f"{' '.join(argv)}\n{done.stdout}{done.stderr}")

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException]) -> str:  # type: ignore[override]
        if isinstance(excinfo.value, UsernsFailed):
            return f"failed in its user namespace: {excinfo.value}"
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[Path, int | None, str]:
        path, line, name = self.original.reportinfo()
        return Path(path), line, f"{name} (in a user namespace)"


def replace(items: list[pytest.Item]) -> None:
    """Each `userns` item becomes a `UsernsRun` of itself (outside the user namespace)."""
    if inner():
        return
    for i, item in enumerate(items):
        if item.get_closest_marker("userns") is None or item.parent is None:
            continue
        items[i] = UsernsRun.from_parent(item.parent, name=item.name, original=item)

"""Shared fixtures: root-only gating, the 198.18/15 safety net, test hosts in namespaces."""

from __future__ import annotations

import itertools
import os
import pathlib
import shutil
import subprocess
from collections.abc import Callable, Iterator

import pytest

import ciuser
import harness
import userns

REQUIRE_NETNS = os.environ.get("EGRESS_REQUIRE_NETNS") == "1"


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("netns") is None or harness.is_root():
        return
    reason = "needs root to create network namespaces (ip netns add)"
    if REQUIRE_NETNS:
        pytest.fail(f"EGRESS_REQUIRE_NETNS=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    userns.replace(items)


@pytest.fixture(scope="session", autouse=True)
def _netns_session() -> Iterator[None]:
    """Sweep what dead runs left, hold the safety net, and sweep our own leftovers at the end."""
    if not harness.is_root():
        yield
        return
    harness.sweep()
    with harness.safety_net():
        try:
            yield
        finally:
            harness.sweep(os.getpid())


@pytest.fixture
def test_host() -> Iterator[harness.TestHost]:
    """A fresh test host (namespace + veth, 198.18.X.2 inside), removed whatever happens."""
    with harness.test_host() as host:
        yield host


@pytest.fixture
def test_host_factory() -> Iterator[object]:
    """Create several test hosts in one test; all removed at the end."""
    made: list[harness.TestHost] = []

    def make() -> harness.TestHost:
        host = harness.create_test_host()
        made.append(host)
        return host

    try:
        yield make
    finally:
        for host in made:
            host.remove()


@pytest.fixture(scope="session")
def ci_user() -> ciuser.CiUser:
    """The engine run's real unprivileged user (tests/engines/up.sh, tests/ciuser.py): a
    docker-group user with rootless podman. Skipped without an engine run, or failed with
    EGRESS_REQUIRE_ENGINE=1 (docs/testing.md#tests-as-the-runs-unprivileged-user)."""
    found = ciuser.load()
    if isinstance(found, str):
        if os.environ.get(ciuser.REQUIRE_ENV) == "1":
            pytest.fail(f"{ciuser.REQUIRE_ENV}=1 but {found}", pytrace=False)
        pytest.skip(f"{found} (set {ciuser.REQUIRE_ENV}=1 to make this a failure)")
    return found


@pytest.fixture
def run_as_user(
    ci_user: ciuser.CiUser,
) -> Callable[..., subprocess.CompletedProcess[str]]:
    """`run_as_user(argv, input=..., env=..., cwd=..., timeout=..., groups=...)`, which is
    `ci_user.run`: argv run as the run's user, a CompletedProcess (text, captured)."""
    return ci_user.run


_user_dirs = itertools.count(1)


@pytest.fixture
def ci_user_tmp(ci_user: ciuser.CiUser) -> Iterator[pathlib.Path]:
    """A fresh directory the run's user owns (0700, in its home: pytest's tmp_path is under
    root's 0700 /tmp/pytest-of-root), e.g. for NETCUT_STATE_DIR; removed after the test."""
    path = pathlib.Path(ci_user.home, f"tmp-{os.getpid()}-{next(_user_dirs)}")
    path.mkdir(mode=0o700)
    os.chown(path, ci_user.uid, ci_user.gid)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)

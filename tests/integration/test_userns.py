"""A `userns` test runs in a user namespace of its own whoever runs the suite, root or not
(tests/userns.py): were it run as the caller, a CI run as root could not show that it needs
no root (docs/testing.md#which-tests-need-root)."""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.userns


def test_runs_as_root_of_a_user_namespace_that_maps_one_uid() -> None:
    with open("/proc/self/uid_map") as f:
        rows = [line.split() for line in f.read().splitlines()]
    # the initial user namespace maps every uid ("0 0 4294967295"); this one only its
    # creator's, as 0
    assert len(rows) == 1, rows
    assert (rows[0][0], rows[0][2]) == ("0", "1"), rows
    assert os.geteuid() == 0
    with open("/proc/self/mounts") as f:
        mounts = [line.split()[:3] for line in f.read().splitlines()]
    assert ["egress-userns", "/run", "tmpfs"] in mounts  # this host's /run is not seen
    assert os.path.isdir("/run/netns")

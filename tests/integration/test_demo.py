"""The README's main command: the demo tells the whole story and exits 0."""

from __future__ import annotations

import sys

import pytest

import harness
from servers import run

pytestmark = pytest.mark.netns


async def test_demo_runs_end_to_end_and_cleans_up() -> None:
    rc, out, err = await run(sys.executable, "-m", "egress.demo", timeout=120)
    assert rc == 0, out + err
    for needle in (
        "1. Setup, online",
        "2. The cut",
        "3. The agent",
        "4. The audit",
        "403 block_rule",
        "403 reserved_address",
        "OK: ",
    ):
        assert needle in out
    assert "egdemo-" not in harness.ip("netns", "list").stdout

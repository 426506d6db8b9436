"""Real container engines (started by tests/engines/up.sh): podman, docker, containerd.

Engine tests are marked `engine`: they skip when an engine does not answer, and fail instead
when EGRESS_REQUIRE_ENGINE=1 (as .ci/run sets). Every container is named `nc-e<pid>-<n>` and
removed whatever the outcome; networks are the ones up.sh made, four /24s of 198.19.240.0/20
(tests/engines/instance.sh; docs/netcut.md#engines-in-ci).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from enginelib import CTR_NAMESPACE, REQUIRE_ENV, Box, engine_down, start_box


@pytest.fixture(autouse=True)
def _engine_guard(request: pytest.FixtureRequest) -> None:
    marker = request.node.get_closest_marker("engine")
    if marker is None:
        return
    if os.geteuid() != 0:
        why: str | None = "engine tests need root"
    else:
        why = engine_down(marker.args[0])
    if why is None:
        return
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but {why}", pytrace=False)
    pytest.skip(f"{why} (set {REQUIRE_ENV}=1 to make this a failure)")


@pytest.fixture(autouse=True)
def _netcut_state_dir(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records go to a per-test directory, never to the machine's /run/netcut."""
    monkeypatch.setenv("NETCUT_STATE_DIR", str(tmp_path_factory.mktemp("netcut-state")))
    monkeypatch.setenv("CONTAINERD_NAMESPACE", CTR_NAMESPACE)
    monkeypatch.delenv("NETCUT_CONTAINER_RUNTIME", raising=False)


@pytest.fixture
def make_box() -> Iterator[Callable[..., Box]]:
    made: list[Box] = []

    def make(engine: str, **kw: bool) -> Box:
        box = start_box(engine, **kw)
        made.append(box)
        return box

    try:
        yield make
    finally:
        for box in made:
            for step in box.cleanup:
                step()

"""What egress cannot honour in a Harbor task run through inspect-harbor is refused by name,
before anything starts (no `docker` on PATH: a refusal after a start would fail otherwise):
a published port, a capability that could undo the cut, a service named like egress's
namespace holder, an allowlist entry egress cannot express (IPv6), and a compose config that
is no Harbor task's (no policy to enforce). Each sample fails; none runs unfiltered."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from .frameworkvenv import inspect_harbor_venv

DRIVER = Path(__file__).with_name("inspect_harbor_refusals.py")


@pytest.mark.timeout(600)
def test_what_egress_cannot_honour_is_refused_by_name(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    venv = inspect_harbor_venv(tmp_path_factory.getbasetemp())
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {**os.environ, "PATH": str(empty)}  # the venv's python by its path; no docker
    env.pop("DOCKER_HOST", None)
    proc = subprocess.run(
        [str(venv / "bin" / "python"), str(DRIVER), str(tmp_path)],
        capture_output=True, text=True, timeout=500, env=env, cwd=str(tmp_path),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = json.loads(proc.stdout.splitlines()[-1])
    assert "HarborTaskError" in said["ports"] or "sets `ports`" in said["ports"], said
    assert "compose service 'main' sets `ports`" in said["ports"], said
    assert "cap_add: ['NET_ADMIN']" in said["cap_add"], said
    assert "'egress-netns'" in said["holder_name"], said
    assert "2001:db8::1" in said["ipv6"], said
    assert "no `harbor_config`" in said["no_harbor_config"], said

"""egress's verifiers namespace runtime deletes the namespace it made when verifiers ends it:
verifiers' `provision` ends a runtime with `stop()`, which runs `teardown()` and may never
call `cleanup()`, so a runtime that deleted its namespace only in `cleanup()` left one `vfns-*`
namespace per rollout behind (docs/integrations.md#the-namespace-runtime).

A real verifiers run (`verifiers_netns_run.py`, verifiers 0.4.0 in its venv): two rollouts on
the documented path `agent.provision(task)`, each on a runtime egress chose. Only the run's own
namespaces are looked at, so other namespaces on the machine do not matter.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from .frameworkvenv import framework_venv
from servers import run

pytestmark = pytest.mark.netns
HERE = Path(__file__).resolve().parent
ROLLOUTS = 2


def namespaces() -> set[str]:
    out = subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


@pytest.mark.timeout(300)
async def test_a_provisioned_runtime_deletes_its_namespace_at_teardown(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    venv = framework_venv("verifiers", tmp_path_factory.getbasetemp())
    before = namespaces()
    spec = {"audit": str(tmp_path / "audit.jsonl"), "tasks": ROLLOUTS}
    rc, out, err = await run(
        str(venv / "bin" / "python"), str(HERE / "verifiers_netns_run.py"), json.dumps(spec),
        timeout=240, cwd=str(HERE),
    )  # fmt: skip
    made: set[str] = set()
    try:
        assert rc == 0, err[-3000:]
        results = json.loads(out.strip().splitlines()[-1])
        made = {r["netns"] for r in results}
        assert len(results) == ROLLOUTS, results
        assert len(made) == ROLLOUTS, results  # a namespace of its own per runtime
        for result in results:
            assert result["runtime"] == "NamespaceRuntime", result
            assert result["ok"], result["errors"]
            assert result["netns"].startswith("vfns-"), result
            assert result["netns"] not in before, result
            assert result["seen_during"], result  # the check below can see the namespace
            # gone as soon as verifiers' provision ended, before any atexit backstop
            assert result["left_after"] == [], result
        assert made & namespaces() == set(), "the run's namespaces outlived it"
    finally:
        for name in made & namespaces():  # removed whatever the outcome
            subprocess.run(["ip", "netns", "delete", name], check=False, timeout=30)

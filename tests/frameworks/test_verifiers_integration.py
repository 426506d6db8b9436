"""verifiers' own `Agent.run` (verifiers 0.4.0, a scripted harness, no model API) on a
namespace runtime whose execution boundary is `egress.integrations.verifiers`'s
`VerifiersBoundary` (`verifiers_run.py`), in verifiers' venv (issue 21,
docs/integrations.md#verifiers).

Topology as in test_inspect_integration.py: a direct veth from the sandbox to `upstream`
(the task's setup goes that way, before the cut); the proxy, in verifiers' process, reaches
`upstream` through its own veth. verifiers' interception server (the model endpoint) is on
the host's loopback: the route reaches the agent through a forwarder at the same URL.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import harness
from .frameworkvenv import framework_venv
from servers import Origin, run, start_origin

pytestmark = pytest.mark.netns
HERE = Path(__file__).resolve().parent


@dataclass
class Scene:
    sandbox: harness.TestHost
    upstream: harness.TestHost
    direct: harness.Link
    origin: Origin


@pytest.fixture
async def scene(test_host_factory: object) -> AsyncIterator[Scene]:
    sandbox = test_host_factory()  # type: ignore[operator]
    upstream = test_host_factory()  # type: ignore[operator]
    direct = harness.link(sandbox, upstream)
    origin = await start_origin(upstream, 80)
    try:
        yield Scene(sandbox, upstream, direct, origin)
    finally:
        await origin.close()


def _code(args: str) -> str:
    return f"curl -s --max-time 5 -o /dev/null -w '%{{http_code}}' {args}"


async def _run(venv: Path, spec: dict[str, object]) -> dict[str, object]:
    rc, out, err = await run(
        str(venv / "bin" / "python"),
        str(HERE / "verifiers_run.py"),
        json.dumps(spec),
        timeout=540,
        cwd=str(HERE),
    )
    assert rc == 0, err[-3000:]
    result: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    return result


@pytest.mark.timeout(600)
async def test_agent_run_behind_the_proxy(
    scene: Scene, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    venv = framework_venv("verifiers", tmp_path_factory.getbasetemp())
    audit = tmp_path / "audit.jsonl"
    direct = scene.direct.addr_b
    spec = {
        "ns": scene.sandbox.ns,
        "setup_url": f"http://{direct}/setup",
        "commands": [
            _code("http://allowed.test/agent"),
            _code("http://blocked.test/refused"),
            _code(f"--noproxy '*' http://{direct}/direct"),
            _code("{endpoint}/models"),  # the interception route, forwarded in
        ],
        "audit": str(audit),
        "resolve": {"allowed.test": scene.upstream.addr_ns, "blocked.test": scene.upstream.addr_ns},
        # verifiers' own config: a host entry is every port (http to 80 here)
        "config": {"allow": ["allowed.test"]},
    }
    result = await _run(venv, spec)
    assert result["ok"], result["errors"]
    assert result["setup"] == ["200"]  # task setup, before the cut, straight to upstream
    outputs = result["outputs"]
    assert isinstance(outputs, list)
    assert outputs[:3] == ["200", "403", "000"], result
    assert outputs[3] not in ("000", "403"), result  # the model endpoint answered
    routes, reopen = result["prepared"]  # type: ignore[misc]
    assert routes == [result["endpoint"]]
    # prepare_execution(None) after the run: released, the cut restored, online again
    assert reopen is None
    assert result["reopened"] == "200"
    assert [s.path for s in scene.origin.seen] == ["/setup", "/agent", "/setup/again"]
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    judged = [(r["method"], r["host"], r["decision"]) for r in records if "decision" in r]
    assert ("GET", "allowed.test", "allow") in judged
    assert ("GET", "blocked.test", "block") in judged
    assert any(m == "FORWARD" for m, _, _ in judged)  # the endpoint, through its forwarder
    assert [r["reason"] for r in records if r.get("method") == "SANDBOX"] == [
        "sandbox_added",
        "sandbox_removed",
    ]
    assert all(r["client_id"].startswith("vf-") for r in records if r.get("method") == "GET")
    rc, out, err = await run(sys.executable, "-m", "egress.cli", "audit", "verify", str(audit))
    assert rc == 0, out + err


@pytest.mark.timeout(600)
async def test_a_failed_prepare_fails_the_rollout(
    scene: Scene, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # verifiers' own config that verifiers refuses at the cut: the rollout fails, the
    # scripted agent never runs
    venv = framework_venv("verifiers", tmp_path_factory.getbasetemp())
    spec = {
        "ns": scene.sandbox.ns + "-gone",
        "setup_url": f"http://{scene.direct.addr_b}/setup",
        "commands": [_code(f"--noproxy '*' http://{scene.direct.addr_b}/direct")],
        "audit": str(tmp_path / "audit.jsonl"),
        "resolve": {},
        "config": {"allow": ["allowed.test"]},
    }
    result = await _run(venv, spec)
    assert not result["ok"]
    assert "ExecutionNotReady" in str(result["errors"])
    assert result["outputs"] == []
    assert [s.path for s in scene.origin.seen] == []  # setup in a namespace that is not there


def test_docker_runtime_without_an_engine(tmp_path_factory: pytest.TempPathFactory) -> None:
    # EgressDockerRuntime's own parts, in verifiers' venv (no Docker engine is run here):
    # verifiers_docker_check.py says what each value means
    venv = framework_venv("verifiers", tmp_path_factory.getbasetemp())
    proc = subprocess.run(
        [str(venv / "bin" / "python"), str(HERE / "verifiers_docker_check.py")],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # from_verifiers: CONNECT to 443 and plain HTTP to 80 for a rule without port, as
    # verifiers' own proxy refuses CONNECT elsewhere (docs/policy.md#verifiers)
    assert out["allow"] == ["**.pypi.test", "https://files.test:443"]
    assert out["default"] == "deny"
    assert out["client_id"]
    assert out["split"] == [["http://127.0.0.1:8089"], ["https://api.example.test"]]
    # verifiers asks for its network image: not there outside our start, "there" inside,
    # and no other question is touched
    assert out["image_question"] == [1, 0, 1, 2]
    assert out["exec_env"] == [False, True]
    assert out["background_env"]
    assert out["objects"] == [["a.pypi.test"], ["*.evil.test:*", "*.localhost:*"], "allow"]

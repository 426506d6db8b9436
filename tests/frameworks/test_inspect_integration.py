"""inspect-ai's own `eval()` (inspect-ai 0.3.285, `mockllm/model`, a scripted agent calling
inspect's `bash()` tool) in the `egress` sandbox around the shipped namespace sandbox
(`egress-netns`: commands as `nobody`, the sample's setup script included), with an
evaluator policy file and pins from the config, in inspect's venv (issues 21 and 31,
docs/integrations.md#inspect-ai).

Topology: `sandbox` and `upstream` are test hosts; a direct veth joins them (the sample's
setup goes that way, before the cut); the proxy, in inspect's process, reaches `upstream`
through its own veth. Names are pinned to `upstream` by the config's `resolve` and the
evaluator file's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from egress.proxy.net.netns import listen_in_netns

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


def _code(command: str) -> str:
    return f"curl -s --max-time 5 -o /dev/null -w '%{{http_code}}' {command}"


async def _audit_verify(path: Path) -> tuple[int, str]:
    rc, out, err = await run(sys.executable, "-m", "egress.cli", "audit", "verify", str(path))
    return rc, out + err


@pytest.mark.timeout(600)
async def test_inspect_eval_in_an_egress_sandbox(
    scene: Scene, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    venv = framework_venv("inspect", tmp_path_factory.getbasetemp())
    audit = tmp_path / "audit.jsonl"
    direct = scene.direct.addr_b
    evaluator = tmp_path / "evaluator.toml"
    evaluator.write_text(
        f'default = "allow"\nblock = ["blocked.test"]\n'
        f'resolve = {{"blocked.test" = "{scene.upstream.addr_ns}"}}\n'
    )
    spec = {
        "ns": scene.sandbox.ns,
        "setup_url": f"http://{direct}/setup",
        "commands": [
            _code("http://allowed.test/agent"),
            _code("http://blocked.test/refused"),
            _code(f"--noproxy '*' http://{direct}/direct"),
        ],
        "audit": str(audit),
        "resolve": {"allowed.test": scene.upstream.addr_ns},
        # the evaluator file: blocks blocked.test and pins it (composed over `allow`)
        "policy_file": str(evaluator),
        "allow": ["allowed.test"],
        "cut": "sample_start",
        "log_dir": str(tmp_path / "logs"),
    }
    rc, out, err = await run(
        str(venv / "bin" / "python"),
        str(HERE / "inspect_run.py"),
        json.dumps(spec),
        timeout=540,
        cwd=str(HERE),
    )
    assert rc == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result["status"] == "success", result
    assert result["error"] is None
    # the agent's three commands through inspect's bash tool, which passes no environment
    assert result["tools"] == ["200", "403", "000"], result
    # setup reached the network before the cut (directly); the agent only through the proxy
    assert [s.path for s in scene.origin.seen] == ["/setup", "/agent"]
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    # decided requests (an `open` record, docs/audit-log.md, announces one in progress)
    requests = [r for r in records if r.get("method") in ("GET", "CONNECT") and "decision" in r]
    assert [(r["host"], r["decision"]) for r in requests] == [
        ("allowed.test", "allow"),
        ("blocked.test", "block"),
    ]
    assert requests[1]["reason"] == "block_rule"  # the evaluator file's rule, not the default
    # the sample's id, epoch and uuid name the client
    assert all(r["client_id"].startswith("s1-1-") for r in requests), requests
    lifecycle = [r["reason"] for r in records if r.get("method") == "SANDBOX"]
    assert lifecycle == ["sandbox_added", "sandbox_removed"]
    rc, text = await _audit_verify(audit)
    assert rc == 0, text


@pytest.mark.timeout(600)
async def test_a_failed_cut_stops_every_exec(
    scene: Scene, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # inspect logs and ignores a hook's exception: the sandbox itself must refuse to run the
    # agent's commands (here the proxy's port is taken inside the sandbox)
    venv = framework_venv("inspect", tmp_path_factory.getbasetemp())
    squatter = listen_in_netns(scene.sandbox.ns, "127.0.0.1", 3128)
    direct = scene.direct.addr_b
    spec = {
        "ns": scene.sandbox.ns,
        "setup_url": f"http://{direct}/setup",
        "commands": [_code(f"--noproxy '*' http://{direct}/direct")],
        "audit": str(tmp_path / "audit.jsonl"),
        "resolve": {},
        "allow": [],
        "cut": "sample_start",
        "log_dir": str(tmp_path / "logs"),
    }
    try:
        rc, out, err = await run(
            str(venv / "bin" / "python"),
            str(HERE / "inspect_run.py"),
            json.dumps(spec),
            timeout=540,
            cwd=str(HERE),
        )
    finally:
        squatter.close()
    assert rc == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert "could not be cut" in (result["error"] or ""), result
    assert "in use" in result["error"]
    assert result["tools"] == []  # the sample failed at the agent's first command
    assert [s.path for s in scene.origin.seen] == ["/setup"]  # never /direct


def test_namespace_sandbox_defaults(tmp_path_factory: pytest.TempPathFactory) -> None:
    venv = framework_venv("inspect", tmp_path_factory.getbasetemp())
    done = subprocess.run(
        [str(venv / "bin" / "python"), str(HERE / "netns_sandbox_check.py")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    uid, capbnd, *env = out["exec"].splitlines()
    assert uid == "65534"  # nobody
    bounding = int(capbnd.split()[1], 16)
    for cap in (12, 13, 21):  # CAP_NET_ADMIN, CAP_NET_RAW, CAP_SYS_ADMIN
        assert not bounding & (1 << cap), capbnd
    assert not any(line.startswith("EGRESS_HOST_SECRET=") for line in env), env
    # inspect's setup sequence: written as root, chmod +x as root, run as the default user
    assert out["setup"] == [0, "ran", "65534\n"], out
    assert out["escape"] == "BoxError"
    assert out["input"] == "stdin ok"
    assert out["netns"].startswith("insp-")
    assert not out["left"]

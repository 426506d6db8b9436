"""egress chosen where verifiers chooses runtimes (issue 31): verifiers' own config and a
task's `network_allow` / `network_block`, on the documented path `agent.provision(task)`,
yield egress's runtime once `install()` hooked verifiers' runtime lookup
(docs/integrations.md#chosen-from-verifiers-config-and-cli). Before the hook, `provision`
built verifiers' own `DockerRuntime`.

If verifiers changes under the hook (a version outside `SUPPORTED`, a `make_runtime` that no
longer calls `_runtime_cls`), `install()` raises `UnsupportedVerifiers` and these tests fail
with its message: the hook is never silently bypassed.

Topology: a fresh namespace per runtime (the namespace twin of `EgressDockerRuntime`: loopback
only, made and deleted by the runtime); the proxy in verifiers' process reaches `upstream`.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import harness
from .frameworkvenv import framework_venv
from servers import run, start_origin

pytestmark = pytest.mark.netns
HERE = Path(__file__).resolve().parent


def _code(url: str) -> str:
    return f"curl -s --max-time 5 -o /dev/null -w '%{{http_code}}' {url}"


@pytest.mark.timeout(600)
async def test_provision_yields_egress_runtime_with_the_task_lists(
    test_host_factory: object, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    venv = framework_venv("verifiers", tmp_path_factory.getbasetemp())
    upstream: harness.TestHost = test_host_factory()  # type: ignore[operator]
    origin = await start_origin(upstream, 80)
    up = upstream.addr_ns
    spec = {
        "audit": str(tmp_path / "audit.jsonl"),
        "commands": [
            _code("http://allowed.test/a"),
            _code("http://blocked.test/b"),
            _code("http://other.test/c"),
        ],
        "tasks": [
            {"allow": ["allowed.test"], "block": []},
            {"allow": ["*"], "block": ["blocked.test"]},
        ],
    }
    pins = f"allowed.test={up},blocked.test={up},other.test={up}"
    try:
        rc, out, err = await run(
            "env", f"EGRESS_RESOLVE={pins}", str(venv / "bin" / "python"),
            str(HERE / "verifiers_select_run.py"), json.dumps(spec),
            timeout=540, cwd=str(HERE),
        )  # fmt: skip
    finally:
        await origin.close()
    assert rc == 0, err[-3000:]
    first, second = json.loads(out.strip().splitlines()[-1])
    for result in (first, second):
        assert result["runtime"] == "NamespaceRuntime", result
        assert result["ok"], result["errors"]
    # the task's allow list narrowed verifiers' "*": only allowed.test
    assert (first["allow"], first["block"]) == (["allowed.test"], [])
    assert first["outputs"] == ["200", "403", "403"], first
    # the task's block list on top of "*"
    assert (second["allow"], second["block"]) == (["*"], ["blocked.test"])
    assert second["outputs"] == ["200", "403", "200"], second
    assert [s.path for s in origin.seen] == ["/a", "/a", "/c"]
    records = [json.loads(line) for line in Path(spec["audit"]).read_text().splitlines()]
    assert {r["client_id"][:3] for r in records if r.get("method") == "GET"} == {"vf-"}


def test_the_hook_fits_the_installed_verifiers(tmp_path_factory: pytest.TempPathFactory) -> None:
    # the pinned range, the hook's target, and install / uninstall round trip; a docker
    # config maps to EgressDockerRuntime by default
    venv = framework_venv("verifiers", tmp_path_factory.getbasetemp())
    script = (
        "import verifiers, importlib.metadata as m\n"
        "from verifiers.v1 import runtimes\n"
        "from verifiers.v1.runtimes.docker import DockerConfig, DockerRuntime\n"
        "from egress.integrations import vf_hook as s\n"
        "from egress.integrations.verifiers import EgressDockerRuntime, install, uninstall\n"
        "assert runtimes._runtime_cls(DockerConfig()) is DockerRuntime\n"
        "install()\n"
        "assert runtimes._runtime_cls(DockerConfig()) is EgressDockerRuntime\n"
        "assert runtimes.runtime_is_local(DockerConfig())\n"
        "install()  # idempotent\n"
        "uninstall()\n"
        "assert runtimes._runtime_cls(DockerConfig()) is DockerRuntime\n"
        "print(m.version('verifiers'), s.SUPPORTED)\n"
        # verifiers changed under the hook: refused loudly, never a silent fall-back
        "real = runtimes.make_runtime\n"
        "runtimes.make_runtime = lambda config, name=None: DockerRuntime(config, name)\n"
        "try:\n    install()\nexcept s.UnsupportedVerifiers as exc:\n    print('changed:', exc)\n"
        "runtimes.make_runtime = real\n"
        "s.importlib.metadata.version = lambda name: '0.5.0'\n"
        "try:\n    install()\nexcept s.UnsupportedVerifiers as exc:\n    print('version:', exc)\n"
        "assert runtimes._runtime_cls(DockerConfig()) is DockerRuntime\n"
    )
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("0.4.0 "), done.stdout
    assert "changed: verifiers 0.4.0: make_runtime no longer looks runtimes up" in done.stdout
    assert "version: verifiers 0.5.0 is not a version" in done.stdout


@pytest.mark.timeout(600)
async def test_vf_eval_selects_egress_from_its_own_cli(
    test_host_factory: object, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # verifiers' own `vf-eval`, with nothing but its command line (the runtime is
    # `--env.agent.runtime.type docker`) under the launcher; the task's network_allow decides
    venv = framework_venv("verifiers", tmp_path_factory.getbasetemp())
    upstream: harness.TestHost = test_host_factory()  # type: ignore[operator]
    origin = await start_origin(upstream, 80)
    up = upstream.addr_ns
    audit, output = tmp_path / "audit.jsonl", tmp_path / "outputs.json"
    commands = [_code("http://allowed.test/a"), _code("http://other.test/b")]
    try:
        rc, out, err = await run(
            "env", f"PYTHONPATH={HERE}", f"EGRESS_AUDIT={audit}",
            f"EGRESS_RESOLVE=allowed.test={up},other.test={up}",
            f"SCRIPTED_COMMANDS={json.dumps(commands)}", f"SCRIPTED_OUTPUT={output}",
            str(venv / "bin" / "python"), "-m", "egress.integrations.vf_hook",
            "--runtime", "namespace",
            "vf-eval", "fetch_taskset", "--no-push", "-m", "scripted",
            "--env.agent.harness.id", "scripted_harness", "--env.agent.runtime.type", "docker",
            "-o", str(tmp_path / "runs"),
            timeout=540, cwd=str(tmp_path),
        )  # fmt: skip
    finally:
        await origin.close()
    assert rc == 0, out[-2000:] + err[-3000:]
    result = json.loads(output.read_text())
    assert result == {"outputs": ["200", "403"], "runtime": "NamespaceRuntime"}, result
    assert [s.path for s in origin.seen] == ["/a"]
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    records = [r for r in records if "decision" in r]
    judged = {(r["host"], r["decision"]) for r in records if r.get("method") == "GET"}
    assert judged == {("allowed.test", "allow"), ("other.test", "block")}, judged

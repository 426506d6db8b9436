"""A Harbor 0.26 trial through Harbor's own CLI (`harbor trials start`) with its oracle agent
and no model API, in `egress.integrations.harbor.NamespaceEnvironment` on real namespaces:

- the environment's setup reaches the network directly, before any cut;
- the agent phase (`allowlist`: `allowed.test`, and the model host Harbor adds with
  `--allow-agent-host`, which becomes a framework route) is cut in transparent mode: the
  agent's plain `curl` with no proxy settings reaches `allowed.test`; `blocked.test` does not
  resolve (NXDOMAIN) and, asked by address, gets a 403; the model route answers on its own
  port only; a direct connection to the upstream's address never reaches it;
- the verifier phase is online again (Harbor sets the public baseline back after the agent);
- every decision is in the audit log, and `egress audit verify` passes.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

import harness
from .harborvenv import harbor_venv
from servers import Origin, run, start_origin

pytestmark = pytest.mark.netns
HERE = Path(__file__).parent
EGRESS = str(Path(sys.executable).with_name("egress"))


def write_task(task: Path, direct: str, model: str, mode: str) -> None:
    """A task whose solution and tests print what each connection attempt gave."""
    hosts = 'allowed_hosts = ["allowed.test"]\n' if mode == "allowlist" else ""
    (task / "environment").mkdir(parents=True)
    (task / "solution").mkdir()
    (task / "tests").mkdir()
    (task / "task.toml").write_text(
        'schema_version = "1.4"\n[metadata]\n'
        "[verifier]\ntimeout_sec = 120.0\n"
        f'[agent]\ntimeout_sec = 120.0\nnetwork_mode = "{mode}"\n{hosts}'
        "[environment]\nbuild_timeout_sec = 60.0\n"
    )
    (task / "instruction.md").write_text("Fetch http://allowed.test/agent.\n")
    get = "curl -sS --max-time 10"
    code = f"{get} -o /dev/null -w '%{{http_code}}'"
    (task / "environment" / "setup.sh").write_text(
        f"{get} http://{direct}/setup > /root/setup.json\n"
    )
    (task / "solution" / "solve.sh").write_text(
        "#!/bin/sh\n"
        f"echo allowed=$({get} http://allowed.test/agent)\n"
        f"{get} http://blocked.test/agent; echo blocked_by_name=$?\n"
        f"echo blocked_by_address=$({code} -H 'Host: blocked.test' http://{model.split(':')[0]}/)\n"
        f"echo direct=$({code} http://{direct}/direct)\n"
        f"echo model=$({get} http://{model}/v1/models)\n"
        f"echo model_other_port=$({code} http://{model.split(':')[0]}/v1/models)\n"
        "echo setup=$(cat /root/setup.json)\n"
    )
    (task / "tests" / "test.sh").write_text(
        "#!/bin/sh\n"
        f"if {get} http://{direct}/verify > /logs/verifier/online.json; then\n"
        "  echo 1 > /logs/verifier/reward.txt\nelse\n  echo 0 > /logs/verifier/reward.txt\nfi\n"
    )


def lines(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def records(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("mode", ["allowlist", "no-network"])
async def test_oracle_trial_in_a_namespace_environment(
    mode: str, test_host_factory: object, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    venv = harbor_venv(tmp_path_factory.getbasetemp())
    sandbox: harness.TestHost = test_host_factory()  # type: ignore[operator]
    upstream: harness.TestHost = test_host_factory()  # type: ignore[operator]
    direct = harness.link(sandbox, upstream).addr_b  # the sandbox's own way to the upstream
    origin: Origin = await start_origin(upstream, 80)
    model: Origin = await start_origin(upstream, 8089)
    model_url = f"http://{upstream.addr_ns}:8089/v1"
    write_task(tmp_path / "task", direct, f"{upstream.addr_ns}:8089", mode)
    audit = tmp_path / "audit.jsonl"
    # the pins as a user of Harbor's CLI sets them: blocked.test from the environment,
    # allowed.test from the evaluator file's `resolve` table (issue 31: it was dropped)
    evaluator = tmp_path / "evaluator.toml"
    evaluator.write_text(
        f'default = "allow"\nblock = ["evil.test"]\n'
        f'resolve = {{"allowed.test" = "{upstream.addr_ns}"}}\nreserve = ["198.19.254.0/24"]\n'
    )
    try:
        rc, out, err = await run(
            "env", f"EGRESS_AUDIT={audit}", f"EGRESS_RESOLVE=blocked.test={upstream.addr_ns}",
            str(venv / "bin" / "harbor"), "trials", "start",
            "-p", str(tmp_path / "task"), "--agent", "oracle",
            "--env", "egress.integrations.harbor:NamespaceEnvironment",
            "--environment-kwarg", f"netns={sandbox.ns}",
            "--environment-kwarg", f"framework_routes={model_url}",
            "--environment-kwarg", f"egress_policy={evaluator}",
            # Harbor adds the model host to a restricted agent policy (made an allowlist);
            # under no-network it stays no-network: the route alone is reachable
            *(["--allow-agent-host", upstream.addr_ns] if mode == "allowlist" else []),
            "--trials-dir", str(tmp_path / "trials"), "--trial-name", "t1",
            timeout=600,
        )  # fmt: skip
    finally:
        await origin.close()
        await model.close()
    assert rc == 0, out[-3000:] + err[-3000:]
    trial = tmp_path / "trials" / "t1"
    result = json.loads((trial / "result.json").read_text())
    assert result["exception_info"] is None, result["exception_info"]
    agent = lines((trial / "agent" / "oracle.txt").read_text())

    # setup, before the cut: directly to the upstream's link address
    assert json.loads(agent["setup"])["path"] == "/setup"
    # the agent, cut, with no proxy settings: allowed by name through the proxy; under
    # no-network only the framework route (the model) is reachable
    if mode == "allowlist":
        assert json.loads(agent["allowed"])["path"] == "/agent"
    else:
        assert agent["allowed"] == ""
    assert agent["blocked_by_name"] == "6"  # curl: could not resolve host (NXDOMAIN)
    assert agent["blocked_by_address"] == "403"
    assert agent["direct"] == "403"  # the proxy answered; the upstream never saw it
    assert json.loads(agent["model"])["server"].endswith(":8089")
    assert agent["model_other_port"] == "403"  # a framework route: its own port only
    paths = [s.path for s in origin.seen]
    want = ["/setup", "/agent", "/verify"] if mode == "allowlist" else ["/setup", "/verify"]
    assert paths == want, paths
    # the verifier phase is online again: it reached the upstream directly
    assert (trial / "verifier" / "reward.txt").read_text().strip() == "1"
    assert result["verifier_result"]["rewards"]["reward"] == 1

    logged = records(audit)
    by = {(r.get("host"), r.get("method"), r.get("decision")) for r in logged}
    assert (("allowed.test", "GET", "allow") in by) is (mode == "allowlist")
    assert ("blocked.test", "DNS", "block") in by
    assert ("blocked.test", "GET", "block") in by
    assert (direct, "GET", "block") in by
    route = [r for r in logged if r.get("reason") == "framework_route"]
    assert route, "the model host was a framework route"
    assert {r.get("client_id") for r in logged if r.get("method") == "GET"} == {"t1__env"}
    rc, out, err = await run(EGRESS, "audit", "verify", str(audit))
    assert rc == 0, out + err
    # released with restore: the namespace is not cut any more
    rc, out, _ = await run(str(Path(sys.executable).with_name("netcut")), "status", "--netns",
                           sandbox.ns)  # fmt: skip
    assert out.splitlines()[0] == "not cut", out
    assert shutil.which("curl")


@pytest.mark.timeout(900)
async def test_startup_policy_holds_after_setup_for_the_whole_trial(
    test_host_factory: object, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """An `[environment]` allowlist is the baseline: setup runs online, then the cut holds for
    the agent and the verifier alike (Harbor switches nothing)."""
    venv = harbor_venv(tmp_path_factory.getbasetemp())
    sandbox: harness.TestHost = test_host_factory()  # type: ignore[operator]
    upstream: harness.TestHost = test_host_factory()  # type: ignore[operator]
    direct = harness.link(sandbox, upstream).addr_b
    origin: Origin = await start_origin(upstream, 80)
    task = tmp_path / "task"
    write_task(task, direct, f"{upstream.addr_ns}:8089", "allowlist")
    (task / "task.toml").write_text(
        'schema_version = "1.4"\n[metadata]\n[verifier]\ntimeout_sec = 120.0\n'
        "[agent]\ntimeout_sec = 120.0\n"
        '[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["allowed.test"]\n'
    )
    get = "curl -sS --max-time 10"
    (task / "tests" / "test.sh").write_text(
        "#!/bin/sh\n"
        f"{get} http://allowed.test/verify-allowed > /logs/verifier/allowed.json\n"
        f"echo $({get} -o /dev/null -w '%{{http_code}}' http://{direct}/verify-direct)"
        " > /logs/verifier/direct.txt\necho 1 > /logs/verifier/reward.txt\n"
    )
    audit = tmp_path / "audit.jsonl"
    try:
        rc, out, err = await run(
            "env", f"EGRESS_AUDIT={audit}", f"EGRESS_RESOLVE=allowed.test={upstream.addr_ns}",
            str(venv / "bin" / "harbor"), "trials", "start",
            "-p", str(task), "--agent", "oracle",
            "--env", "egress.integrations.harbor:NamespaceEnvironment",
            "--environment-kwarg", f"netns={sandbox.ns}",
            "--trials-dir", str(tmp_path / "trials"), "--trial-name", "t2",
            timeout=600,
        )  # fmt: skip
    finally:
        await origin.close()
    assert rc == 0, out[-3000:] + err[-3000:]
    trial = tmp_path / "trials" / "t2"
    result = json.loads((trial / "result.json").read_text())
    assert result["exception_info"] is None, result["exception_info"]
    agent = lines((trial / "agent" / "oracle.txt").read_text())
    assert json.loads(agent["setup"])["path"] == "/setup"  # before the startup cut
    assert json.loads(agent["allowed"])["path"] == "/agent"
    assert agent["direct"] == "403"
    verifier = trial / "verifier"
    assert json.loads((verifier / "allowed.json").read_text())["path"] == "/verify-allowed"
    assert (verifier / "direct.txt").read_text().strip() == "403"  # still cut
    paths = [s.path for s in origin.seen]
    assert paths == ["/setup", "/agent", "/verify-allowed"], paths
    rc, out, err = await run(EGRESS, "audit", "verify", str(audit))
    assert rc == 0, out + err

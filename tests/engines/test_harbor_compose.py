"""Harbor, whole (issue 31): a task with two compose services, `main` and `db`, run by
Harbor 0.26's own `DockerEnvironment.start()` through `EgressDockerEnvironment` with Docker
Compose v2 (from PyPI, tests/frameworks/composeplugin.py) against the docker engine. Every
service is behind the policy (the allowed host answers, a blocked name and the upstream's
address do not, from `main` and from `db`), and the services reach each other as in
Harbor's own sidecar mode: one shared namespace, `main` reaches `db` on localhost."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from enginelib import harbor_task_rootfs
from frameworks.composeplugin import compose_config
from frameworks.harborvenv import harbor_venv
from unprivuser import ROOT

import harness
from servers import start_origin

pytestmark = [pytest.mark.netns, pytest.mark.engine("docker")]
HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER = os.path.join(HERE, "harbor_compose.py")
DB = "while true; do echo db-says-hi | nc -l -p 5432; done"  # as harbor_compose.py's


@pytest.fixture
def task_image() -> Iterator[str]:
    tag = f"egress-harbor-task:{os.getpid()}"
    image = harbor_task_rootfs()
    subprocess.run(["docker", "import", "-", tag], input=image, check=True, timeout=120,
                   capture_output=True)  # fmt: skip
    try:
        yield tag
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], check=False, capture_output=True)


@pytest.mark.timeout(900)
async def test_every_compose_service_is_behind_the_policy(
    test_host: harness.TestHost, tmp_path_factory: pytest.TempPathFactory, task_image: str
) -> None:
    venv = harbor_venv(tmp_path_factory.getbasetemp())
    config = compose_config(tmp_path_factory.getbasetemp())
    tmp = tmp_path_factory.mktemp("harbor-compose")
    origin = await start_origin(test_host, 80)
    pins = [f"pypi.test={test_host.addr_ns}", f"evil.test={test_host.addr_ns}"]
    env = {**os.environ, "PYTHONPATH": ROOT, "DOCKER_CONFIG": str(config)}
    try:
        proc = await asyncio.create_subprocess_exec(
            str(venv / "bin" / "python"), DRIVER, str(tmp), json.dumps(pins), test_host.addr_ns,
            task_image,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 600)
    finally:
        await origin.close()
    steps: dict[str, dict[str, Any]] = {}
    for line in out.decode().splitlines():
        if line.startswith("{"):
            said = json.loads(line)
            steps[said.pop("step")] = said
    assert proc.returncode == 0, err.decode(errors="replace")[-4000:]
    started = steps["started"]
    assert started["sandbox"] == f"docker:{started['holder']}"
    assert len(started["netns"]) == 1, started  # main, db and the holder: one namespace
    assert started["cut"] == "cut"
    for service in ("main", "db"):
        seen = steps["agent"][service]
        assert "rc=0" in seen["allowed"], (service, seen)
        assert "rc=0" not in seen["blocked"], (service, seen)  # no answer for the name
        assert "403" in seen["address"], (service, seen)  # the proxy's refusal
        assert "rc=0" not in seen["address"], (service, seen)
    assert steps["agent"]["main"]["db"].strip() == "db-says-hi"
    assert [s.path for s in origin.seen] == ["/", "/"]  # the two allowed fetches only
    assert steps["public"] == {"released": True}
    assert steps["stopped"] == {"left": [], "override": True}


TASK_TOML = """schema_version = "1.4"
[metadata]
[verifier]
timeout_sec = 120.0
[agent]
timeout_sec = 120.0
network_mode = "allowlist"
allowed_hosts = ["pypi.test"]
[environment]
build_timeout_sec = 120.0
"""
SOLVE = """#!/bin/sh
echo pypi=$(timeout 15 wget -q -O - http://pypi.test/trial >/dev/null 2>&1; echo $?)
echo evil=$(timeout 15 wget -q -O - http://evil.test/ >/dev/null 2>&1; echo $?)
echo db=$(nc 127.0.0.1 5432 </dev/null)
"""


@pytest.mark.timeout(900)
async def test_harbor_trial_with_two_services(
    test_host: harness.TestHost, tmp_path_factory: pytest.TempPathFactory, task_image: str
) -> None:
    """`harbor trials start` with Harbor's oracle agent on the docker environment, a task whose
    image Harbor builds (`FROM` the offline task image) and whose compose file adds `db`: the
    agent phase reaches the allowed host, not the blocked one, and `db` on localhost."""
    venv = harbor_venv(tmp_path_factory.getbasetemp())
    config = compose_config(tmp_path_factory.getbasetemp())
    tmp = tmp_path_factory.mktemp("harbor-trial-compose")
    task = tmp / "two-services"
    for sub in ("environment", "solution", "tests"):
        (task / sub).mkdir(parents=True)
    (task / "task.toml").write_text(TASK_TOML)
    (task / "instruction.md").write_text("Fetch the index and ask the database.\n")
    (task / "environment" / "Dockerfile").write_text(f"FROM {task_image}\nWORKDIR /app\n")
    db = {"services": {"db": {"image": task_image, "command": ["sh", "-c", DB]}}}
    (task / "environment" / "docker-compose.yaml").write_text(json.dumps(db))
    (task / "solution" / "solve.sh").write_text(SOLVE)
    (task / "tests" / "test.sh").write_text("#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n")
    origin = await start_origin(test_host, 80)
    pins = f"pypi.test={test_host.addr_ns},evil.test={test_host.addr_ns}"
    env = {
        **os.environ,
        "PATH": f"{venv / 'bin'}:{os.environ['PATH']}",
        "DOCKER_CONFIG": str(config),
        "EGRESS_RESOLVE": pins,
        "EGRESS_AUDIT": str(tmp / "audit.jsonl"),
    }
    try:
        proc = await asyncio.create_subprocess_exec(
            "harbor", "trials", "start", "-p", str(task), "--agent", "oracle",
            "--env", "egress.integrations.harbor:EgressDockerEnvironment",
            cwd=str(tmp), env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        out, _ = await asyncio.wait_for(proc.communicate(), 600)
    finally:
        await origin.close()
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text[-4000:]
    assert "'reward': 1.0" in text, text[-4000:]
    [trial] = [p for p in (tmp / "trials").iterdir() if p.is_dir()]
    agent = (trial / "agent" / "oracle.txt").read_text()
    assert "pypi=0" in agent, agent
    assert "evil=0" not in agent, agent  # the blocked name gets no answer
    assert "db=db-says-hi" in agent, agent
    assert [s.path for s in origin.seen] == ["/trial"]
    audit = [json.loads(line) for line in (tmp / "audit.jsonl").read_text().splitlines()]
    assert any("evil.test" in json.dumps(r) for r in audit), audit[-5:]
    project = trial.name.lower()
    left = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={project}__env"],
        capture_output=True, text=True, check=False,
    ).stdout.split()  # fmt: skip
    assert left == []

"""Harbor tasks through inspect-harbor (issue 31, item 5): a Harbor `allowlist` task, built
here (no registry; its image `FROM` the offline task image), run by inspect-harbor 1.0.0's
own entry point with `sandbox_env_name="egress"`, inspect's `react` agent driven by
`mockllm/model` and inspect-harbor's scorer, against the docker engine with Compose v2
(inspect_harbor_run.py, in the inspect-harbor venv). Before: egress's sandbox refused the
compose config (TypeError), and with inspect's `docker` the task ran with the full network.

- agent phase (the `[environment]` allowlist): the allowed host answers through the proxy,
  with no proxy settings; a blocked name does not resolve; the upstream's address, with the
  blocked name as Host or without, gets the proxy's 403; a raw TCP connection to another
  port of the upstream is reset by the proxy and never reaches it;
- the task's second service (`db`) is behind the same policy, and `main` reaches it on
  localhost;
- verifier phase (`[verifier]` allowlist of `verify.test`): the verifier reaches its own host
  and no longer the agent's;
- every decision is in the audit log, which verifies; nothing of the project is left.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from frameworks.composeplugin import compose_config
from frameworks.frameworkvenv import inspect_harbor_venv
from test_harbor_compose import task_image  # noqa: F401 (the fixture)

import harness
from servers import start_origin

pytestmark = [pytest.mark.netns, pytest.mark.engine("docker")]
DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "inspect_harbor_run.py")
API = os.path.join(os.path.dirname(os.path.abspath(__file__)), "inspect_harbor_api.py")
EGRESS = str(Path(sys.executable).with_name("egress"))
# root without any capability (no setns, no CAP_NET_ADMIN), as test_unprivileged_engines.py
CAPLESS = ["setpriv", "--inh-caps=-all", "--bounding-set=-all", "--"]


def _images() -> set[str]:
    out = subprocess.run(
        ["docker", "images", "--format", "{{.Repository}}:{{.Tag}}"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return {line for line in out.split() if line.startswith("hb__")}


def _said(text: str | None) -> dict[str, str]:
    lines = (text or "").splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line and line[0].isalpha())


def _ok(said: str, path: str) -> bool:
    """The origin's answer for `path`, and wget's exit status 0."""
    return f'"{path}"' in said and said.endswith("rc=0")


@pytest.mark.timeout(1500)
async def test_harbor_allowlist_task_through_inspect_harbor(
    test_host: harness.TestHost,
    tmp_path_factory: pytest.TempPathFactory,
    task_image: str,  # noqa: F811
) -> None:
    venv = inspect_harbor_venv(tmp_path_factory.getbasetemp())
    config = compose_config(tmp_path_factory.getbasetemp())
    tmp = tmp_path_factory.mktemp("inspect-harbor")
    up = test_host.addr_ns
    origin = await start_origin(test_host, 80)
    other_port = await start_origin(test_host, 7000)
    audit = tmp / "audit.jsonl"
    env = {
        **os.environ,
        "DOCKER_CONFIG": str(config),
        "EGRESS_RESOLVE": f"allowed.test={up},blocked.test={up},verify.test={up}",
        "EGRESS_AUDIT": str(audit),
    }
    before = _images()
    try:
        proc = await asyncio.create_subprocess_exec(
            str(venv / "bin" / "python"), DRIVER, str(tmp), up, task_image,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env, cwd=str(tmp),
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 1200)
    finally:
        await origin.close()
        await other_port.close()
        for image in _images() - before:
            subprocess.run(["docker", "rmi", "-f", image], capture_output=True, check=False)
    assert proc.returncode == 0, err.decode(errors="replace")[-4000:]
    result: dict[str, Any] = json.loads(out.decode().splitlines()[-1])
    assert result["status"] == "success", result
    assert result["error"] is None, result
    agent = _said("\n".join(result["tools"]))

    # the agent phase: the allowed host by name, through the proxy, with no proxy settings
    assert _ok(agent["allowed"], "/agent"), agent
    assert "bad address" in agent["blocked"], agent  # no answer for the name
    assert "403" in agent["blocked_by_address"], agent
    assert "403" in agent["direct"], agent
    # a raw TCP connection to another port: judged by address at the proxy and reset, never
    # reaching the upstream
    assert agent["tcp"] == "", agent
    assert other_port.seen == []
    # the second service: behind the same policy, reached on localhost
    assert _ok(agent["db_allowed"], "/db"), agent
    assert not agent["db_blocked"].endswith("rc=0"), agent
    assert "403" in agent["db_address"], agent
    # the verifier phase: its own allowlist, not the agent's
    verifier = _said(result["explanation"])
    assert _ok(verifier["verify"], "/verify"), verifier
    assert "bad address" in verifier["verify_allowed"], verifier
    assert result["score"] == 1.0
    assert [s.path for s in origin.seen] == ["/agent", "/db", "/verify"]

    records = [json.loads(line) for line in audit.read_text().splitlines() if line.strip()]
    by = {(r.get("host"), r.get("method"), r.get("decision")) for r in records}
    for seen in [
        ("allowed.test", "GET", "allow"),
        ("blocked.test", "DNS", "block"),
        ("blocked.test", "GET", "block"),
        (up, "GET", "block"),
        (up, "CONNECT", "block"),  # the raw TCP connection to port 7000
        ("verify.test", "GET", "allow"),
        ("allowed.test", "DNS", "block"),  # in the verifier phase
    ]:
        assert seen in by, (seen, sorted(map(str, by)))
    answered = [r.get("status") for r in records if r.get("host") == "allowed.test"
                and r.get("method") == "GET"]  # fmt: skip
    assert answered == [200, 200], answered  # the agent's and db's fetch, through the proxy
    clients = {r.get("client_id") for r in records if r.get("method") == "GET"}
    assert len(clients) == 1, clients
    assert "egress-ih-" in str(next(iter(clients))), clients
    done = await asyncio.create_subprocess_exec(EGRESS, "audit", "verify", str(audit),
                                                stdout=asyncio.subprocess.PIPE)  # fmt: skip
    assert await done.wait() == 0
    left = subprocess.run(
        ["docker", "ps", "-a", "--format", '{{.Label "com.docker.compose.project"}}'],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert not [p for p in left if p.startswith("egress-ih-")], left


RECIPE_TASK = """schema_version = "1.1"
[metadata]
[verifier]
timeout_sec = 120.0
[agent]
timeout_sec = 120.0
[environment]
build_timeout_sec = 300.0
network_mode = "allowlist"
allowed_hosts = ["pypi.org"]
"""


@pytest.mark.timeout(1200)
async def test_the_inspect_harbor_recipe_runs_as_written(
    test_host: harness.TestHost,
    tmp_path_factory: pytest.TempPathFactory,
    task_image: str,  # noqa: F811
) -> None:
    """docs/integrations.md's `inspect-harbor` recipe, unedited, on a task `my-task` whose
    solution fetches the allowed and an unlisted host and whose test rewards only that
    outcome: `success 1.0`, the allowed fetch alone reached the upstream."""
    from frameworks.test_recipes import recipes

    _, twin, body = recipes()["inspect-harbor"]
    assert twin == "tests/engines/test_inspect_harbor.py"
    venv = inspect_harbor_venv(tmp_path_factory.getbasetemp())
    config = compose_config(tmp_path_factory.getbasetemp())
    tmp = tmp_path_factory.mktemp("inspect-harbor-recipe")
    (tmp / "recipe.py").write_text(body)
    task = tmp / "my-task"
    for sub in ("environment", "solution", "tests"):
        (task / sub).mkdir(parents=True)
    (task / "task.toml").write_text(RECIPE_TASK)
    (task / "instruction.md").write_text("Fetch the PyPI index.\n")
    (task / "environment" / "Dockerfile").write_text(f"FROM {task_image}\nWORKDIR /app\n")
    get = "timeout 15 wget -q -O /dev/null"
    (task / "solution" / "solve.sh").write_text(
        f"#!/bin/sh\n{get} http://pypi.org/simple/; echo pypi=$? > /app/result\n"
        f"{get} http://example.com/; echo example=$? >> /app/result\n"
    )
    (task / "tests" / "test.sh").write_text(
        '#!/bin/sh\nif [ "$(cat /app/result)" = "$(printf \'pypi=0\\nexample=1\')" ]; then\n'
        "  echo 1 > /logs/verifier/reward.txt\nelse\n  echo 0 > /logs/verifier/reward.txt\nfi\n"
    )
    up = test_host.addr_ns
    origin = await start_origin(test_host, 80)
    env = {
        **os.environ,
        "DOCKER_CONFIG": str(config),
        "EGRESS_RESOLVE": f"pypi.org={up},example.com={up}",
    }
    before = _images()
    try:
        proc = await asyncio.create_subprocess_exec(
            str(venv / "bin" / "python"), "recipe.py",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env, cwd=str(tmp),
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 900)
    finally:
        await origin.close()
        for image in _images() - before:
            subprocess.run(["docker", "rmi", "-f", image], capture_output=True, check=False)
    assert proc.returncode == 0, err.decode(errors="replace")[-4000:]
    assert out.decode().split()[-2:] == ["success", "1.0"], out.decode()[-2000:]
    assert [s.path for s in origin.seen] == ["/simple/"]
    records = [json.loads(line) for line in (tmp / "audit.jsonl").read_text().splitlines()]
    by = {(r.get("host"), r.get("method"), r.get("decision")) for r in records}
    assert ("pypi.org", "GET", "allow") in by
    assert ("example.com", "DNS", "block") in by


@pytest.mark.timeout(900)
@pytest.mark.parametrize("capless", [False, True], ids=["root", "capless"])
async def test_the_service_sandboxes_through_inspects_sandbox_api(
    capless: bool,
    test_host: harness.TestHost,
    tmp_path_factory: pytest.TempPathFactory,
    task_image: str,  # noqa: F811
) -> None:
    """`exec` (environment, directory, user, stdin, exit status, inspect's timeout and output
    limit), `write_file` / `read_file` (nested, binary, text, missing, directory) on a
    `no-network` task's project: cut with nothing allowed, and nothing left after cleanup. As
    root the cut is direct; as root without any capability (no setns: a docker-group user's
    position, with Python 3.12 under /root) netcut's helper cuts."""
    venv = inspect_harbor_venv(tmp_path_factory.getbasetemp())
    config = compose_config(tmp_path_factory.getbasetemp())
    origin = await start_origin(test_host, 80)
    try:
        proc = await asyncio.create_subprocess_exec(
            *(CAPLESS if capless else []), str(venv / "bin" / "python"), API, task_image,
            test_host.addr_ns,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "DOCKER_CONFIG": str(config)},
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 600)
    finally:
        await origin.close()
    assert origin.seen == []
    assert proc.returncode == 0, err.decode(errors="replace")[-4000:]
    said = json.loads(out.decode().splitlines()[-1])
    assert said["services"] == ["main"]
    assert said["env_cwd_user"] == "x:/tmp:65534"
    assert said["stdin"] == "from stdin"
    assert said["status"] == 3
    assert said["timeout"] == "TimeoutError"
    assert said["big_len"] <= 10 * 1024 * 1024  # inspect's limit: retained, not all of it
    assert said["read_bytes"] == list(b"\x00\x01binary")
    assert said["read_text"] == "héllo"
    assert said["missing"] == "FileNotFoundError"
    assert said["directory"] == "IsADirectoryError"
    assert said["cut"] is True
    assert said["cut_mode"] == ("helper" if capless else "direct")
    assert not said["offline"].endswith("rc=0"), said["offline"]
    assert said["left"] == []

"""Harbor's `EgressDockerEnvironment` on a task with two compose services (run by
test_harbor_compose.py in Harbor's venv, as root, with Compose v2 in DOCKER_CONFIG).

The task: `main` (Harbor's prebuilt service, the test box image) and `db`, which answers
`db-says-hi` on port 5432; its startup policy is an allowlist of `pypi.test`. Harbor's own
`start()` brings the compose project up with egress's override; the checks run with
Harbor's own `exec` (main) and `docker compose exec` (db). One JSON line per step.

argv: TMP PINS_JSON UPSTREAM_ADDR IMAGE (busybox, with `bash` as its sh)
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

DB = "while true; do echo db-says-hi | nc -l -p 5432; done"
# (busybox 1.35's static wget crashes with -T: the time limit is timeout's)
FETCH = "timeout 15 wget -q -O - {} 2>&1; echo rc=$?"


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def netns_of(container: str) -> str:
    pid = subprocess.run(
        ["docker", "inspect", "--format", "{{.State.Pid}}", container],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    return os.readlink(f"/proc/{pid}/ns/net")


async def main(tmp: Path, pins: list[str], upstream: str, image: str) -> None:
    from harbor.models.task.config import EnvironmentConfig, NetworkPolicy
    from harbor.models.trial.paths import TrialPaths

    from egress import configure_shared_proxy
    from egress.integrations.harbor import NETNS_SERVICE, EgressDockerEnvironment

    env_dir = tmp / "environment"
    env_dir.mkdir()
    compose = {"services": {"db": {"image": image, "command": ["sh", "-c", DB]}}}
    (env_dir / "docker-compose.yaml").write_text(json.dumps(compose))
    trial = TrialPaths(tmp / "trial")
    trial.mkdir()
    configure_shared_proxy(resolve=dict(p.split("=", 1) for p in pins))
    env = EgressDockerEnvironment(
        environment_dir=env_dir,
        environment_name="egress-compose",
        session_id=f"egc{os.getpid()}__env",
        trial_paths=trial,
        task_env_config=EnvironmentConfig(docker_image=image),
        network_policy=NetworkPolicy(network_mode="allowlist", allowed_hosts=["pypi.test"]),
    )

    async def in_service(service: str, command: str) -> str:
        if service == "main":
            done = await env.exec(command, timeout_sec=60)
            return (done.stdout or "") + (done.stderr or "")
        done = await env._run_docker_compose_command(
            ["exec", "-T", service, "sh", "-c", command], check=False, timeout_sec=60
        )
        return done.stdout or ""

    try:
        await env.start(force_build=False)  # (a failed start is stopped too, as Harbor does)
        assert env.egress is not None
        assert env.egress.execution is not None
        ids = {}
        for service in ("main", "db", NETNS_SERVICE):
            found = await env._run_docker_compose_command(["ps", "-q", service])
            ids[service] = (found.stdout or "").strip()
        say(
            step="started",
            sandbox=env.egress.sandbox,
            holder=ids[NETNS_SERVICE],
            netns=sorted({netns_of(c) for c in ids.values()}),
            cut=env.egress.execution.cut.status.state,
            cut_mode=env.egress.execution.cut_mode,
        )
        said = {}
        for service in ("main", "db"):
            said[service] = {
                "allowed": await in_service(service, FETCH.format("http://pypi.test/")),
                "blocked": await in_service(service, FETCH.format("http://evil.test/")),
                "address": await in_service(service, FETCH.format(f"http://{upstream}/")),
            }
        said["main"]["db"] = await in_service("main", "nc 127.0.0.1 5432 </dev/null")
        say(step="agent", **said)
        await env._apply_network_policy(NetworkPolicy(network_mode="public"))
        say(step="public", released=env.egress.execution is None)
    finally:
        await env.stop(delete=True)
    project = f"label=com.docker.compose.project=egc{os.getpid()}__env"
    left = subprocess.run(
        ["docker", "ps", "-aq", "--filter", project],
        capture_output=True, text=True, check=False,
    ).stdout.split()  # fmt: skip
    say(step="stopped", left=left, override=env._egress_override is None)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]))

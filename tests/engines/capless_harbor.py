"""Harbor's side as a process without any capability (run by test_unprivileged_engines.py
in Harbor's venv: uid 0 with an empty bounding set, because Harbor's Python 3.12 lives under
/root, which a new user cannot enter). `HarborEgress.apply` of an allowlist phase
(transparent, default cut_mode: the helper, since this process cannot setns), then, when told
on stdin, the public phase (released, restored); `EgressDockerEnvironment` takes `cut_mode`;
`NamespaceEnvironment` refuses to start without root. One JSON line per step.

argv: CONTAINER PINS_JSON ENV_DIR
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


async def main(container: str, pins: list[str], tmp: Path) -> None:
    from harbor.models.task.config import EnvironmentConfig, NetworkPolicy
    from harbor.models.trial.paths import TrialPaths

    from egress import configure_shared_proxy
    from egress.integrations.harbor import (
        EgressDockerEnvironment,
        HarborEgress,
        NamespaceEnvironment,
    )

    with open("/proc/self/status") as f:
        caps = next(line.split()[1] for line in f if line.startswith("CapEff:"))
    env_dir = tmp / "environment"
    env_dir.mkdir(exist_ok=True)
    (env_dir / "Dockerfile").write_text("FROM scratch\n")
    kwargs = {
        "environment_dir": env_dir,
        "environment_name": "t",
        "session_id": "t1__env",
        "trial_paths": TrialPaths(tmp / "trial"),
        "task_env_config": EnvironmentConfig(),
        "network_policy": NetworkPolicy(),
    }
    docker_env = EgressDockerEnvironment(cut_mode="helper", **kwargs)
    try:
        EgressDockerEnvironment(cut_mode="setns", **kwargs)
        bad = "accepted"
    except ValueError as exc:
        bad = str(exc)
    try:
        await NamespaceEnvironment(**kwargs).start(False)
        namespace = "started"
    except PermissionError as exc:
        namespace = str(exc)
    say(
        step="classes",
        caps=caps,
        cut_mode=docker_env._egress_cut_mode,  # type: ignore[attr-defined]
        bad=bad,
        namespace=namespace,
    )
    configure_shared_proxy(resolve=dict(p.split("=", 1) for p in pins))
    egress = HarborEgress(f"docker:{container}", "t1")
    try:
        await egress.apply(NetworkPolicy(network_mode="allowlist", allowed_hosts=["pypi.test"]))
    except Exception as exc:
        say(step="apply", error=f"{type(exc).__name__}: {exc}")
        return
    execution = egress.execution
    assert execution is not None
    say(
        step="apply",
        cut_mode=execution.cut_mode,
        reason=execution.cut_mode_reason,
        kinds=[li.kind for li in execution.listeners],
    )
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    assert line.strip() == "release", line
    await egress.apply(NetworkPolicy(network_mode="public"))
    say(step="release", released=egress.execution is None)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], json.loads(sys.argv[2]), Path(sys.argv[3])))

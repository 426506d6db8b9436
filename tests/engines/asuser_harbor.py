"""Harbor's own trial entry point as the engine run's docker-group user (run by
test_harbor_as_user.py with Harbor's Python 3.12 venv, as `netcut-ci-user`): what this
process is (its ids, groups and capability sets, from /proc/self/status), what the two
environment classes say to a process without root, then `harbor trials start ARGS...` in
this same process (Harbor's CLI, `harbor.cli.main:app`), then what the process is after it.
One JSON line per step on stdout; Harbor's own output goes to stderr.

argv: ENV_DIR HARBOR_ARGS...
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from pathlib import Path


def say(**fields: object) -> None:
    print(json.dumps(fields), file=sys.__stdout__, flush=True)


def identity() -> dict[str, object]:
    """This process as the kernel sees it: real and effective ids, groups, capabilities."""
    with open("/proc/self/status") as f:
        status = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
    return {
        "uid": os.getuid(),
        "euid": os.geteuid(),
        "gid": os.getgid(),
        "groups": sorted(os.getgroups()),
        **{k: status[k].strip() for k in ("CapEff", "CapPrm", "CapInh", "CapAmb", "NoNewPrivs")},
    }


async def classes(tmp: Path) -> dict[str, str]:
    """What each environment class says here: an unknown `cut_mode` is refused by name, and
    the namespace environment refuses to start without root (it says what to use)."""
    from harbor.models.task.config import EnvironmentConfig, NetworkPolicy
    from harbor.models.trial.paths import TrialPaths

    from egress.integrations.harbor import EgressDockerEnvironment, NamespaceEnvironment

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
    return {"bad": bad, "namespace": namespace}


def main(tmp: Path, args: list[str]) -> int:
    say(step="before", **identity())
    say(step="classes", **asyncio.run(classes(tmp)))
    from harbor.cli.main import app

    sys.argv = ["harbor", *args]
    code: object = 0
    with contextlib.redirect_stdout(sys.stderr):
        try:
            app()
        except SystemExit as exc:
            code = exc.code
    say(step="after", code=code, **identity())
    return code if isinstance(code, int) else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), sys.argv[2:]))

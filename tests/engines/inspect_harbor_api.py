"""The Harbor service sandboxes through inspect's sandbox API (`exec`, `write_file`,
`read_file`) on a real compose project: run by test_inspect_harbor.py in the inspect-harbor
venv, as root or as root without any capability (then netcut's helper cuts), with Compose v2
in DOCKER_CONFIG. The task is `no-network` (so the project is
policed and cut, with nothing allowed).

argv: IMAGE UPSTREAM_ADDR. Prints one JSON object of what each call gave.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

from inspect_ai.util import ComposeConfig

from egress.integrations import close_shared_proxy
from egress.integrations.hb_inspect import HarborServiceSandbox, sample_cleanup, sample_init

HARBOR = {"environment": {"network_mode": "no-network"}, "agent": {}, "verifier": {}}


async def main(image: str, upstream: str) -> None:
    config = ComposeConfig(
        services={"main": {"image": image, "command": ["tail", "-f", "/dev/null"]}}
    )
    envs = await sample_init("api", config, {"harbor_config": HARBOR, "__sample_id__": "s1"})
    said: dict[str, Any] = {"services": list(envs)}
    main_box = envs["main"]
    assert isinstance(main_box, HarborServiceSandbox)
    project = main_box.project.name
    try:
        done = await main_box.exec(["sh", "-c", 'echo "$A:$(pwd):$(id -u)"'], env={"A": "x"},
                                   cwd="/tmp", user="65534")  # fmt: skip
        said["env_cwd_user"] = done.stdout.strip()
        said["stdin"] = (await main_box.exec(["cat"], input="from stdin")).stdout
        said["status"] = (await main_box.exec(["sh", "-c", "exit 3"])).returncode
        try:
            await main_box.exec(["sleep", "30"], timeout=1)
            said["timeout"] = "returned"
        except TimeoutError:
            said["timeout"] = "TimeoutError"
        big = await main_box.exec(["head", "-c", "11000000", "/dev/zero"])
        said["big_len"] = len(big.stdout)
        await main_box.write_file("/work/deep/file.bin", b"\x00\x01binary")
        said["read_bytes"] = list(await main_box.read_file("/work/deep/file.bin", text=False))
        await main_box.write_file("/work/text.txt", "héllo")
        said["read_text"] = await main_box.read_file("/work/text.txt")
        for name, path in (("missing", "/work/nothing"), ("directory", "/work")):
            try:
                await main_box.read_file(path)
                said[name] = "read"
            except (FileNotFoundError, IsADirectoryError) as exc:
                said[name] = type(exc).__name__
        fetch = f"timeout 10 wget -q -O - http://{upstream}/; echo rc=$?"
        said["offline"] = (await main_box.exec(["sh", "-c", fetch])).stdout.strip()
        egress = main_box.project.egress
        said["cut"] = egress is not None and egress.execution is not None
        said["cut_mode"] = egress.execution.cut_mode if egress and egress.execution else None
    finally:
        await sample_cleanup(envs)
        await close_shared_proxy()
    left = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={project}"],
        capture_output=True, text=True, check=False,
    ).stdout.split()  # fmt: skip
    said["left"] = left
    print(json.dumps(said))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))

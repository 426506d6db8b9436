"""The `egress-netns` sandbox's safe defaults, through inspect's own sandbox API (run in
inspect's venv by test_inspect_integration.py; prints one JSON object).

A new namespace per sample (loopback only), commands as `nobody` with the cut-undoing
capabilities out of the bounding set, no host environment, inspect's setup-script sequence
(write to /tmp, `chmod +x` as root, run as the default user), a path out of the root refused,
and the namespace gone after cleanup.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess

from inspect_ai.util._sandbox.registry import registry_find_sandboxenv

import egress.integrations.inspect  # noqa: F401  (registers both sandboxes, as the entry point does)


async def main() -> None:
    os.environ["EGRESS_HOST_SECRET"] = "host-only"
    cls = registry_find_sandboxenv("egress-netns")
    envs = await cls.sample_init("t", None, {})
    box = envs["default"]
    out: dict[str, object] = {"netns": box.egress_target}
    try:
        ids = await box.exec(["sh", "-c", "id -u; grep CapBnd /proc/self/status; env"])
        out["exec"] = ids.stdout
        # a directory the write creates belongs to the user too: the script writes beside itself
        script = "#!/bin/sh\nid -u > /tmp/inspect-x/done\necho ran\n"
        await box.write_file("/tmp/inspect-x/setup", script)
        await box.exec(["chmod", "+x", "/tmp/inspect-x/setup"], user="root")
        ran = await box.exec(["/tmp/inspect-x/setup"])
        done = await box.read_file("/tmp/inspect-x/done") if ran.returncode == 0 else ran.stderr
        out["setup"] = [ran.returncode, ran.stdout.strip(), done]
        try:
            await box.write_file("../../etc/evil", "x")
            out["escape"] = "written"
        except Exception as exc:
            out["escape"] = type(exc).__name__
        piped = await box.exec(["cat"], input="stdin ok")
        out["input"] = piped.stdout
    finally:
        await cls.sample_cleanup("t", None, envs, False)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    out["left"] = str(out["netns"]) in listed
    print(json.dumps(out))


asyncio.run(main())

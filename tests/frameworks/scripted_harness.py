"""A verifiers harness that calls no model: it runs the commands `verifiers_run.py` gives it
(or, under verifiers' own CLI, `$SCRIPTED_COMMANDS`, a JSON list), one `runtime.run` each,
and keeps what they printed (a scripted agent; under the CLI also written to
`$SCRIPTED_OUTPUT`). Loaded by verifiers by its module name (`scripted_harness`)."""

from __future__ import annotations

import json
import os
from typing import Any

from verifiers.v1.configs.harness import HarnessConfig
from verifiers.v1.harness import Harness
from verifiers.v1.runtimes import ProgramResult

COMMANDS: list[str] = []
OUTPUTS: list[str] = []
SEEN: dict[str, str] = {}


class ScriptedHarness(Harness[HarnessConfig]):
    EXECUTES_CODE = True
    NEEDS_CONTAINER = False

    async def launch(self, ctx: Any, trace: Any, runtime: Any, endpoint: str, secret: str,
                     mcp_urls: dict[str, str], data: Any, **_: Any) -> ProgramResult:  # fmt: skip
        SEEN["endpoint"] = endpoint
        commands = COMMANDS or json.loads(os.environ.get("SCRIPTED_COMMANDS", "[]"))
        for command in commands:
            result = await runtime.run(["sh", "-c", command.replace("{endpoint}", endpoint)], {})
            OUTPUTS.append(result.stdout.strip())
        if "SCRIPTED_OUTPUT" in os.environ:
            with open(os.environ["SCRIPTED_OUTPUT"], "w") as fh:
                json.dump({"outputs": OUTPUTS, "runtime": type(runtime).__name__}, fh)
        return ProgramResult(0, "\n".join(OUTPUTS), "")


__all__ = ["ScriptedHarness"]

"""A verifiers harness that calls no model: it runs the commands `verifiers_run.py` gives it,
one `runtime.run` each, and keeps what they printed (a scripted agent). Loaded by verifiers
by its module name (`HarnessConfig(id="scripted_harness")`)."""

from __future__ import annotations

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
        for command in COMMANDS:
            result = await runtime.run(["sh", "-c", command.replace("{endpoint}", endpoint)], {})
            OUTPUTS.append(result.stdout.strip())
        return ProgramResult(0, "\n".join(OUTPUTS), "")


__all__ = ["ScriptedHarness"]

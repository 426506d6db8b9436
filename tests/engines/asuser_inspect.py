"""inspect-ai's own `eval()` (`mockllm/model`, a scripted agent calling inspect's `bash()`
tool) in the `egress` sandbox around a docker container (dockerbox_sandbox.py), run by
test_unprivileged_engines.py as a docker-group user in inspect's venv, with the `egress`
sandbox's defaults (loopback mode, `cut_mode="auto"`).

argv[1] is a JSON object: `container`, `commands`, `audit`, `resolve`, `allow`, `log_dir`.
Prints one JSON object: each command's output, the sample's error (if any), the eval's status,
the cut the solver found in place (its mode and why, from the `egress` sandbox) and what this
process is (trialprobe.identity) before and after the eval.
"""

from __future__ import annotations

import json
import sys

import dockerbox_sandbox  # noqa: F401  (registers the `dockerbox` sandbox)
from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.model import ChatMessageTool, ModelOutput, ModelUsage, get_model
from inspect_ai.solver import Generate, Solver, TaskState, generate, solver, use_tools
from inspect_ai.tool import bash
from inspect_ai.util import sandbox
from trialprobe import identity

import egress
from egress.integrations.inspect import EgressSandboxConfig, EgressSandboxEnvironment


@solver
def record_cut() -> Solver:
    """The sample's cut as the solver finds it: the mode netcut chose, and why."""

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        execution = sandbox().as_type(EgressSandboxEnvironment).execution
        state.metadata["cut"] = (
            {"cut_mode": execution.cut_mode, "reason": execution.cut_mode_reason}
            if execution is not None
            else None
        )
        return state

    return solve


def main() -> None:
    before = identity()
    spec = json.loads(sys.argv[1])
    egress.configure_shared_proxy(audit=spec["audit"], resolve=spec["resolve"])
    outputs = [
        ModelOutput.for_tool_call("mockllm/model", "bash", {"command": command})
        for command in spec["commands"]
    ]
    outputs.append(ModelOutput.from_content("mockllm/model", "done"))
    for output in outputs:
        output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
    task = Task(
        dataset=[Sample(input="fetch the pages", id="s1")],
        solver=[record_cut(), use_tools([bash(timeout=120)]), generate()],
        sandbox=(
            "egress",
            EgressSandboxConfig(
                inner="dockerbox", inner_config=spec["container"], allow=spec["allow"]
            ),
        ),
    )
    model = get_model("mockllm/model", custom_outputs=outputs)
    [log] = eval(task, model=model, display="none", log_dir=spec["log_dir"])
    sample = log.samples[0] if log.samples else None
    tools = [m.text for m in (sample.messages if sample else []) if isinstance(m, ChatMessageTool)]
    print(json.dumps({
        "status": log.status,
        "error": str(sample.error.message) if sample and sample.error else None,
        "tools": tools,
        "cut": sample.metadata.get("cut") if sample else None,
        "before": before,
        "after": identity(),
    }))  # fmt: skip


if __name__ == "__main__":
    main()

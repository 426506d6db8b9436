"""Run inspect-ai's own `eval()` with `mockllm/model` and a scripted agent, in the `egress`
sandbox around the shipped `egress-netns` one (run in inspect's venv by
test_inspect_integration.py).

argv[1] is a JSON object: `ns` (the sandbox's namespace), `setup_url` (reached directly by
the sample's setup script, which inspect writes and runs as `nobody`), `commands` (the
agent's bash commands, in order), `audit` (the audit log path), `resolve` (pins, as the
config's `resolve`), `policy_file` (or null), `allow`, `cut`. Prints one JSON object: each
command's output, the sample's error (if any) and the eval's status.
"""

from __future__ import annotations

import json
import sys

from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.model import ChatMessageTool, ModelOutput, ModelUsage, get_model
from inspect_ai.solver import generate, use_tools
from inspect_ai.tool import bash

import egress
from egress.integrations.inspect import EgressSandboxConfig
from egress.integrations.netns_sandbox import NamespaceSandboxConfig


def main() -> None:
    spec = json.loads(sys.argv[1])
    egress.configure_shared_proxy(audit=spec["audit"])
    outputs = [
        ModelOutput.for_tool_call("mockllm/model", "bash", {"command": command})
        for command in spec["commands"]
    ]
    outputs.append(ModelOutput.from_content("mockllm/model", "done"))
    for output in outputs:
        # with usage given, mockllm counts no tokens: tiktoken would fetch its encoding
        output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
    task = Task(
        dataset=[
            Sample(
                input="fetch the pages",
                id="s1",
                setup=f"curl -sS --max-time 5 -o /dev/null {spec['setup_url']}",
            )
        ],
        solver=[use_tools([bash(timeout=60)]), generate()],
        sandbox=(
            "egress",
            EgressSandboxConfig(
                inner="egress-netns",
                inner_config=NamespaceSandboxConfig(netns=spec["ns"]),
                allow=spec["allow"],
                cut=spec["cut"],
                policy_file=spec.get("policy_file"),
                resolve=tuple(f"{k}={v}" for k, v in spec["resolve"].items()),
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
    }))  # fmt: skip


if __name__ == "__main__":
    main()

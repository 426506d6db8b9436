"""A Harbor `allowlist` task run through inspect-harbor's own entry point (`harbor(path=...,
sandbox_env_name="egress")`) with its own agent (inspect's `react`, bash tool) driven by
`mockllm/model`, and its own scorer (the task's `tests/test.sh`). Run by
test_inspect_harbor.py in the inspect-harbor venv, as root, with Compose v2 in DOCKER_CONFIG
and the pins in EGRESS_RESOLVE, the audit log in EGRESS_AUDIT.

The task (written here, no registry): `main` (built `FROM` the offline task image) and `db`,
which on each connection to its port 5432 fetches the allowed and the blocked host itself
and says what it got. `[environment]` is an allowlist of `allowed.test` (the agent phase
inherits it); `[verifier]` is an allowlist of `verify.test` only.

argv: TMP UPSTREAM_ADDR IMAGE. Prints one JSON object: the agent's tool outputs, the score,
its explanation (the verifier's output), the sample's error and the eval's status.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from inspect_ai import eval
from inspect_ai.model import ChatMessageTool, ModelOutput, ModelUsage, get_model
from inspect_ai.model._providers.mockllm import MockLLM
from inspect_harbor import harbor

FETCH = "timeout 15 wget -q -O - {} 2>&1; echo rc=$?"
TASK_TOML = """schema_version = "1.1"
[metadata]
[verifier]
timeout_sec = 120.0
network_mode = "allowlist"
allowed_hosts = ["verify.test"]
[agent]
timeout_sec = 120.0
[environment]
build_timeout_sec = 300.0
network_mode = "allowlist"
allowed_hosts = ["allowed.test"]
"""


def write_task(task: Path, upstream: str, image: str) -> None:
    for sub in ("environment", "solution", "tests"):
        (task / sub).mkdir(parents=True)
    (task / "task.toml").write_text(TASK_TOML)
    (task / "instruction.md").write_text("Fetch http://allowed.test/agent.\n")
    (task / "environment" / "Dockerfile").write_text(f"FROM {image}\nWORKDIR /app\n")
    probe = "\n".join([
        "#!/bin/sh",
        "echo db_allowed=$(" + FETCH.format("http://allowed.test/db") + ")",
        "echo db_blocked=$(" + FETCH.format("http://blocked.test/db") + ")",
        "echo db_address=$(" + FETCH.format(f"http://{upstream}/db") + ")",
    ])  # fmt: skip
    db = (
        f"printf '%s\\n' {' '.join(repr(line) for line in probe.splitlines())} > /tmp/probe"
        " && chmod +x /tmp/probe && exec nc -ll -p 5432 -e /tmp/probe"
    )
    compose = {
        "services": {
            "main": {
                "build": {"context": "${CONTEXT_DIR}"},
                "image": "${MAIN_IMAGE_NAME}",
                "command": ["tail", "-f", "/dev/null"],
            },
            "db": {"image": image, "command": ["sh", "-c", db]},
        }
    }
    (task / "environment" / "docker-compose.yaml").write_text(json.dumps(compose))
    (task / "solution" / "solve.sh").write_text("#!/bin/sh\ntrue\n")
    (task / "tests" / "test.sh").write_text(
        "#!/bin/sh\n"
        "echo verify=$(" + FETCH.format("http://verify.test/verify") + ")\n"
        "echo verify_allowed=$(" + FETCH.format("http://allowed.test/verify") + ")\n"
        "echo 1 > /logs/verifier/reward.txt\n"
    )


async def _count_text_tokens(self: MockLLM, text: str) -> int:
    return len(text) // 4 + 1


def main(tmp: Path, upstream: str, image: str) -> None:
    # inspect-harbor's agent compacts its context and so counts tokens, which for mockllm is
    # tiktoken, which fetches its encoding from the internet: count offline instead
    MockLLM.count_text_tokens = _count_text_tokens
    write_task(tmp / "allowlist-task", upstream, image)
    commands = [
        "echo allowed=$(" + FETCH.format("http://allowed.test/agent") + ")",
        "echo blocked=$(" + FETCH.format("http://blocked.test/agent") + ")",
        "echo blocked_by_address=$("
        + FETCH.format(f"--header 'Host: blocked.test' http://{upstream}/agent")
        + ")",
        "echo direct=$(" + FETCH.format(f"http://{upstream}/direct") + ")",
        f"echo tcp=$(printf 'GET /tcp HTTP/1.0\\r\\n\\r\\n' | timeout 15 nc {upstream} 7000)",
        "nc 127.0.0.1 5432 </dev/null",  # db_allowed=..., db_blocked=..., db_address=...
    ]
    outputs = [
        ModelOutput.for_tool_call("mockllm/model", "bash", {"command": command})
        for command in commands
    ]
    outputs.append(ModelOutput.for_tool_call("mockllm/model", "submit", {"answer": "done"}))
    for output in outputs:
        # with usage given, mockllm counts no tokens: tiktoken would fetch its encoding
        output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
    task = harbor(path=str(tmp / "allowlist-task"), sandbox_env_name="egress")
    model = get_model("mockllm/model", custom_outputs=outputs)
    [log] = eval(task, model=model, display="none", log_dir=str(tmp / "logs"))
    sample = log.samples[0] if log.samples else None
    tools = [m.text for m in (sample.messages if sample else []) if isinstance(m, ChatMessageTool)]
    score = next(iter(sample.scores.values())) if sample and sample.scores else None
    print(json.dumps({
        "status": log.status,
        "error": str(sample.error.message) if sample and sample.error else None,
        "tools": tools,
        "score": score.value if score else None,
        "explanation": score.explanation if score else None,
    }))  # fmt: skip


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3])

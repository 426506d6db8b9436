"""The examples in README.md and docs/ that show an expected output, found and run
(docs/testing.md#examples-in-the-docs-are-tests).

- A fenced block whose lines start with `$ ` is a shell example: each `$ ` command (with its
  `\\` continuation lines) is followed by the output it prints, up to the next `$ ` line.
- A ```python block with `>>> ` prompts is a doctest.
- An HTML comment right before the block says what the example needs, so the test tier can
  run it: `<!-- example: root -->` (a fresh network namespace: root-test tier),
  `<!-- example: serve ARGS -->` (the block runs against `egress serve ARGS --listen
  127.0.0.1:0`, started in a fresh network namespace; the block's own port number stands for
  the real one), `<!-- example: ran-by TEST -->` (the output is produced and compared by TEST,
  which the checker confirms exists).

Output is compared after `normalize`: what differs from run to run by nature (times,
durations, ports of ephemeral listeners, hashes, run ids, pids) is replaced by placeholders
on both sides; nothing else is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.S | re.M)
_DIRECTIVE = re.compile(r"<!--\s*example:\s*(.*?)\s*-->\s*$", re.S)


@dataclass
class Step:
    command: str
    expected: str


@dataclass
class Example:
    page: Path
    line: int
    kind: str  # "shell" | "doctest"
    body: str
    needs: str = ""  # the directive, "" for none
    steps: list[Step] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.page.name}:{self.line}"


def examples() -> list[Example]:
    found: list[Example] = []
    for page in PAGES:
        text = page.read_text()
        for match in _FENCE.finditer(text):
            lang, body = match.group(1).strip(), match.group(2)
            if lang.startswith("output:"):
                continue  # blocks generated and checked by their own scripts
            line = text.count("\n", 0, match.start()) + 1
            before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            directive = _DIRECTIVE.search(before)
            needs = directive.group(1) if directive else ""
            if lang == "python" and ">>> " in body:
                found.append(Example(page, line, "doctest", body, needs))
            elif lang in ("", "console", "sh", "shell") and any(
                row.startswith("$ ") for row in body.splitlines()
            ):
                found.append(Example(page, line, "shell", body, needs, _steps(body)))
    return found


def _steps(body: str) -> list[Step]:
    steps: list[Step] = []
    rows = body.splitlines()
    i = 0
    while i < len(rows):
        if not rows[i].startswith("$ "):
            i += 1
            continue
        command = [rows[i][2:]]
        while command[-1].endswith("\\") and i + 1 < len(rows):
            i += 1
            command.append(rows[i])
        i += 1
        out = []
        while i < len(rows) and not rows[i].startswith("$ "):
            out.append(rows[i])
            i += 1
        steps.append(Step("\n".join(command), "\n".join(out).strip("\n")))
    return steps


_VOLATILE = [
    (re.compile(r"\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z"), "<TS>"),
    (re.compile(r"\b[0-9a-f]{64}\b"), "<SHA256>"),
    (re.compile(r"\b[0-9a-f]{32}\b"), "<RUN>"),
    (re.compile(r"sha256:[0-9a-f]{16}\b"), "sha256:<POLICY>"),
    (re.compile(r"\b\d+(?:\.\d+)? ms\b"), "<N> ms"),
    (re.compile(r"\bafter \d+ ms\b"), "after <N> ms"),
]


def normalize(text: str, ports: dict[str, str] | None = None) -> str:
    """`text` with its run-to-run values replaced; `ports` maps a real port to the doc's."""
    for real, shown in (ports or {}).items():
        text = re.sub(rf"(?<=:){real}\b", shown, text)
    for pattern, placeholder in _VOLATILE:
        text = pattern.sub(placeholder, text)
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines())


MARK = "@@doc-example-step@@"


def run_shell(
    example: Example,
    cwd: Path,
    *,
    prefix: str = "",
    ports: dict[str, str] | None = None,
    timeout: float = 120,
) -> list[tuple[str, str, str]]:
    """Run the example's commands in one bash session (stderr with stdout, as a terminal
    shows them); returns (command, expected, got) per step, both normalized. `ports` maps
    the doc's port to the real one (commands get the real one, output is mapped back)."""
    import contextlib
    import os
    import signal
    import subprocess
    import sys

    script = []
    for i, step in enumerate(example.steps):
        command = step.command
        for shown, real in (ports or {}).items():
            command = re.sub(rf"(?<=:){shown}\b", real, command)
        script.append(f"{command}\n__rc=$?; printf '\\n{MARK}{i}\\n'; (exit $__rc)\n")
    path = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
    # unbuffered output (stdbuf for C programs like curl, PYTHONUNBUFFERED for ours), so
    # stdout and stderr interleave as on a terminal
    argv = [*prefix.split(), "stdbuf", "-o0", "-e0", "bash", "-c", "exec 2>&1\n" + "".join(script)]
    # its own process group: whatever an example starts is ended with it, also on a timeout
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd,
        env={**os.environ, "PATH": path, "COLUMNS": "100", "PYTHONUNBUFFERED": "1"},
        start_new_session=True,
    ) as proc:  # fmt: skip
        try:
            stdout, _ = proc.communicate(timeout=timeout)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    outputs = stdout.split(MARK)
    back = {real: shown for shown, real in (ports or {}).items()}
    results = []
    for i, step in enumerate(example.steps):
        got = outputs[i] if i < len(outputs) else ""
        if i > 0:
            got = got.split("\n", 1)[1] if "\n" in got else ""  # the step number after MARK
        results.append((step.command, normalize(step.expected), normalize(got, back)))
    return results

"""The docs' examples that need root or a network, run in a fresh network namespace each
(docs/testing.md#examples-in-the-docs-are-tests): `<!-- example: root -->` blocks as they
are, `<!-- example: serve ARGS -->` blocks against `egress serve ARGS` started in that
namespace. Fixed ports (3128, 9090) are free there, and nothing leaves it."""

from __future__ import annotations

import itertools
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from docexamples import ROOT, examples, run_shell

pytestmark = pytest.mark.netns

# Runs a server step (argv: how many lines it shows, the command): relays its stdout and ends
# it (SIGTERM) once it printed as many lines as the doc shows, however long its start takes on
# a busy machine (importing alone took 2.5 s at load 22); a deadline only for one that never
# gets there, whose output then differs from the doc's.
UNTIL_SHOWN = """
import subprocess, sys, threading
shown, command = int(sys.argv[1]), sys.argv[2]
server = subprocess.Popen(["bash", "-c", "exec " + command], stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True)
deadline = threading.Timer(90, server.terminate)
deadline.start()
for seen, line in enumerate(server.stdout, 1):
    sys.stdout.write(line)
    sys.stdout.flush()
    if seen == shown:
        server.terminate()
deadline.cancel()
sys.exit(server.wait())
"""

MARKED = [
    e for e in examples() if e.kind == "shell" and e.needs.split(" ", 1)[0] in ("root", "serve")
]
_count = itertools.count()


def _namespace() -> str:
    name = f"docex-{os.getpid()}-{next(_count)}"
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=30)
    subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True, timeout=30)
    return name


@pytest.mark.parametrize("example", MARKED, ids=lambda e: e.name)
def test_marked_example(example) -> None:  # type: ignore[no-untyped-def]
    ns = _namespace()
    server = None
    try:
        with tempfile.TemporaryDirectory() as work:
            (Path(work) / "egress").symlink_to(ROOT / "egress")  # the docs' relative paths
            ports: dict[str, str] = {}
            if example.needs.startswith("serve"):
                args = example.needs.split()[1:]
                server = subprocess.Popen(
                    ["ip", "netns", "exec", ns, sys.executable, "-m", "egress.cli", "serve",
                     "--listen", "127.0.0.1:0", "--quiet", *args],
                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=work,
                )  # fmt: skip
                assert server.stdout is not None
                line = server.stdout.readline()
                assert line.startswith("listening on 127.0.0.1:"), line
                shown = re.search(r"127\.0\.0\.1:(\d+|PORT)\b", example.body)
                assert shown, example.name
                ports[shown.group(1)] = line.strip().rsplit(":", 1)[1]
            for step in example.steps:  # a server in the example: it runs until it shows
                if step.command.startswith("egress serve"):  # what the doc shows, then SIGTERM
                    lines = len(step.expected.splitlines())
                    step.command = shlex.join(
                        [sys.executable, "-c", UNTIL_SHOWN, str(lines), step.command]
                    )
            results = run_shell(example, Path(work), prefix=f"ip netns exec {ns}", ports=ports)
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
            assert server.stdout is not None
            server.stdout.close()
        subprocess.run(["ip", "netns", "del", ns], check=False, timeout=30)
    for command, expected, got in results:
        if "127.0.0.1:0 " in command:  # an ephemeral port: any number is the example's
            got = re.sub(r"(listening on 127\.0\.0\.1:)\d+", r"\g<1>N", got)
            expected = re.sub(r"(listening on 127\.0\.0\.1:)\d+", r"\g<1>N", expected)
        assert got == expected, f"{example.name}: $ {command}"

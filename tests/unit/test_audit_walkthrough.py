"""The walkthrough of docs/audit-log.md, run: every shown command still does what it shows.

Writes the sample log (tests/unit/audit_samples.py) with the real AuditLog in a temporary
directory and runs the real commands there. As a test it checks that every
```output:NAME``` block of docs/audit-log.md is produced and that the verifier still says
OK for the intact log and FAILED for each tampered copy. Run as a script
(`.venv/bin/python tests/unit/test_audit_walkthrough.py`) it replaces each block with what
the commands printed. Long lines are not cut; nothing is edited.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from audit_samples import write_sample

from docexamples import normalize

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "audit-log.md"
AUDIT = f"{sys.executable} -m egress.audit.cli"


def sh(command: str, cwd: Path, shown: str | None = None) -> str:
    """Run `command` in bash; return `$ shown` and its output (stdout and stderr)."""
    done = subprocess.run(
        ["bash", "-c", command.replace("egress audit", AUDIT)],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )
    text = f"$ {shown or command}\n{done.stdout}{done.stderr}"
    if done.returncode:
        text += f"$ echo $?\n{done.returncode}\n"
    return text


DEV_FULL = """
import asyncio
from egress.audit.log import AuditLog
async def main():
    log = AuditLog("/dev/full", fail_mode="closed", retry_interval=0.2, close_timeout=0.5)
    await log.start()
    log.record({"client": "198.18.0.2:41000", "method": "CONNECT", "host": "pypi.org",
                "port": 443, "decision": "allow", "reason": "allow_rule", "rule": "pypi.org"})
    await log.flush()
    print("accepting:", log.accepting, "write_errors:", log.write_errors)
    await log.aclose()
    print("lines_written:", log.lines_written, "lines_dropped:", log.lines_dropped)
asyncio.run(main())
"""


def outputs(work: Path) -> dict[str, str]:
    asyncio.run(write_sample(str(work / "audit.jsonl"), rotate_bytes=8000))
    out = {
        "ls": sh("ls -l | tail -n +2", work, "ls -l"),
        "verify": sh("egress audit verify audit.jsonl*", work),
        "summarize": sh("egress audit summarize --top 5 audit.jsonl*", work),
        "json": sh("egress audit summarize --json --top 2 audit.jsonl* | head -40", work),
        "filter": sh(
            "egress audit filter --client task-8 --reason reserved_address "
            "--reason sni_mismatch audit.jsonl* | sed -n '1p;5p'",
            work,
            "egress audit filter --client task-8 --reason reserved_address "
            "--reason sni_mismatch audit.jsonl*   # (first and fifth line shown)",
        )
        + sh(
            "egress audit filter --decision block --host '*.github.com' audit.jsonl* | head -2",
            work,
            "egress audit filter --decision block --host '*.github.com' audit.jsonl* | head -2",
        )
        + sh("egress audit tail -n 3 --control audit.jsonl*", work),
        "raw": sh("egress audit filter --json --reason port_not_allowed audit.jsonl*", work),
        "start": sh("zcat audit.jsonl.5.gz | head -2", work),
        "devfull": sh(
            f"{sys.executable} -c '{DEV_FULL}'",
            work,
            "python dev_full_example.py   # DEV_FULL in "
            "tests/unit/test_audit_walkthrough.py; stdout, then stderr",
        ),
    }
    head = re.search(r"head ([0-9a-f]{64})", out["verify"])
    assert head is not None
    out["head"] = sh(f"egress audit verify --head {head[1]} audit.jsonl*", work)
    tampered = work / "tampered"
    for name, steps in (
        (
            "tamper",
            [
                'sed -i \'3s/"decision":"block"/"decision":"allow"/\' audit.jsonl',
                "sed -i '7d' audit.jsonl",
            ],
        ),
        ("missing", ["sed -i '5d' audit.jsonl", "rm audit.jsonl.3.gz"]),
        ("truncated", ["head -c -40 audit.jsonl > cut && mv cut audit.jsonl"]),
    ):
        shutil.rmtree(tampered, ignore_errors=True)
        tampered.mkdir()
        for file in work.glob("audit.jsonl*"):
            shutil.copy(file, tampered)
        out[name] = "".join(sh(step, tampered) for step in steps) + sh(
            "egress audit verify audit.jsonl*", tampered
        )
    return out


def _same_run_apart(text: str) -> str:
    """A block without what differs between two runs of the same sample (times, hashes, run
    ids, pids, client ports, file sizes and dates): the rest must be what the page shows."""
    text = normalize(text)
    text = re.sub(
        r"^(-rw\S+ \d+ \S+ \S+) +\d+ \w+ +\d+ \d\d:\d\d ", r"\1 <SIZE> <DATE> ", text, flags=re.M
    )
    text = re.sub(r'"pid":\d+', '"pid":<PID>', text)
    return re.sub(r"\b198\.18\.0\.(\d+):\d+\b", r"198.18.0.\1:<PORT>", text)


def test_walkthrough_outputs(tmp_path: Path) -> None:
    results = outputs(tmp_path)
    page = DOC.read_text()
    blocks = set(re.findall(r"```output:(\w+)\n", page))
    assert blocks == set(results)
    for name, output in results.items():  # the page shows what the commands print today
        shown = re.search(rf"```output:{name}\n(.*?)```", page, re.DOTALL)
        assert shown is not None
        assert _same_run_apart(output) == _same_run_apart(shown.group(1)), (
            f"docs/audit-log.md block {name} is stale: python tests/unit/test_audit_walkthrough.py"
        )
    assert "OK:" in results["verify"]
    assert "OK:" in results["head"]
    for name in ("tamper", "missing", "truncated"):
        assert "FAILED" in results[name], name
    assert "accepting: False" in results["devfull"]


def main() -> None:
    with tempfile.TemporaryDirectory() as directory:
        results = outputs(Path(directory))
    text = DOC.read_text()
    for name, output in results.items():
        pattern = re.compile(rf"(```output:{name}\n).*?(```)", re.DOTALL)
        text, count = pattern.subn(lambda m, o=output: m[1] + o + m[2], text)
        assert count == 1, name
    DOC.write_text(text)


if __name__ == "__main__":
    main()

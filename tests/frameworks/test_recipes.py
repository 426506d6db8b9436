"""Every recipe in docs/integrations.md, run as written against the pinned framework
packages in their venvs (issue 31: the documented snippets did not run).

A recipe is a fenced block right after `<!-- recipe: NAME -->`. The test gives each the world
its text assumes and nothing else: a working directory (with the task or evaluator file it
names), `EGRESS_RESOLVE` pinning its hosts to a test upstream (198.18.0.0/15), root. The
block itself is written to a file unchanged.

A recipe whose marker names a `twin=` test needs what the tests do not have (a model API, a
container image): its twin runs the same path, and here its imports are checked against the
real framework (every imported name exists), and the block compiles.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import harness
from .frameworkvenv import framework_venv
from .harborvenv import harbor_venv
from servers import Origin, run, start_origin

pytestmark = pytest.mark.netns
HERE = Path(__file__).resolve().parent
PAGE = HERE.parents[1] / "docs" / "integrations.md"
_RECIPE = re.compile(r"<!-- recipe: (\S+)(?: twin=(\S+))? -->\n```(\w+)\n(.*?)^```", re.S | re.M)


def recipes() -> dict[str, tuple[str, str | None, str]]:
    """NAME -> (language, twin test or None, body)."""
    return {m[1]: (m[3], m[2], m[4]) for m in _RECIPE.finditer(PAGE.read_text())}


def test_every_recipe_is_run_or_has_a_twin() -> None:
    found = recipes()
    assert set(found) == {
        "verifiers-namespace",
        "verifiers-config",
        "inspect-namespace",
        "harbor-namespace",
        "inspect-harbor",
    }, sorted(found)
    for name, (_, twin, body) in found.items():
        if twin is not None:
            assert (HERE.parents[1] / twin).is_file(), (name, twin)
        if name != "harbor-namespace":
            compile(body, name, "exec")
    # every code block of the page is a recipe (the harbor install line is prose)
    fences = re.findall(r"^```(\w+)\n", PAGE.read_text(), re.M)
    assert fences.count("python") + fences.count("sh") == len(found), fences


async def _upstream(factory: object) -> tuple[harness.TestHost, Origin]:
    host: harness.TestHost = factory()  # type: ignore[operator]
    return host, await start_origin(host, 80)


@pytest.mark.timeout(600)
async def test_verifiers_namespace_recipe(
    test_host_factory: object, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    venv = framework_venv("verifiers", tmp_path_factory.getbasetemp())
    _, _, body = recipes()["verifiers-namespace"]
    (tmp_path / "recipe.py").write_text(body)
    up, origin = await _upstream(test_host_factory)
    try:
        rc, out, err = await run(
            "env", f"EGRESS_RESOLVE=pypi.org={up.addr_ns}", str(venv / "bin" / "python"),
            "recipe.py", cwd=str(tmp_path), timeout=300,
        )  # fmt: skip
    finally:
        await origin.close()
    assert rc == 0, err[-3000:]
    assert out.split() == ["pypi.org", "200", "example.com", "403"], out
    assert [s.path for s in origin.seen] == ["/simple/"]
    await _verified(tmp_path / "audit.jsonl")


@pytest.mark.timeout(600)
async def test_inspect_namespace_recipe(
    test_host_factory: object, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    venv = framework_venv("inspect", tmp_path_factory.getbasetemp())
    _, _, body = recipes()["inspect-namespace"]
    (tmp_path / "recipe.py").write_text(body)
    up, origin = await _upstream(test_host_factory)
    try:
        rc, out, err = await run(
            "env", f"EGRESS_RESOLVE=pypi.org={up.addr_ns}", str(venv / "bin" / "python"),
            "recipe.py", cwd=str(tmp_path), timeout=300,
        )  # fmt: skip
    finally:
        await origin.close()
    assert rc == 0, err[-3000:]
    assert out.split()[-2:] == ["200", "403"], out  # after inspect's own banner
    assert [s.path for s in origin.seen] == ["/simple/"]
    await _verified(tmp_path / "audit.jsonl")


@pytest.mark.timeout(900)
async def test_harbor_namespace_recipe(
    test_host_factory: object, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    venv = harbor_venv(tmp_path_factory.getbasetemp())
    _, _, body = recipes()["harbor-namespace"]
    (tmp_path / "recipe.sh").write_text(body)
    task = tmp_path / "my-task"
    for sub in ("environment", "solution", "tests"):
        (task / sub).mkdir(parents=True)
    (task / "task.toml").write_text(
        'schema_version = "1.4"\n[metadata]\n[verifier]\ntimeout_sec = 120.0\n'
        '[agent]\ntimeout_sec = 120.0\nnetwork_mode = "allowlist"\n'
        'allowed_hosts = ["pypi.org", "example.com"]\n[environment]\nbuild_timeout_sec = 60.0\n'
    )
    (task / "instruction.md").write_text("Fetch the PyPI index.\n")
    code = "curl -s --max-time 10 -o /dev/null -w '%{http_code}'"
    (task / "solution" / "solve.sh").write_text(
        f"#!/bin/sh\necho pypi=$({code} http://pypi.org/simple/)\n"
        f"echo example=$({code} http://example.com/)\n"
    )
    (task / "tests" / "test.sh").write_text("#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n")
    # the evaluator narrows the task: example.com is blocked whatever the task allows
    (tmp_path / "evaluator.toml").write_text('default = "allow"\nblock = ["example.com"]\n')
    up, origin = await _upstream(test_host_factory)
    pins = f"pypi.org={up.addr_ns},example.com={up.addr_ns}"
    try:
        rc, out, err = await run(
            "env", f"PATH={venv / 'bin'}:/usr/sbin:/usr/bin:/sbin:/bin",
            f"EGRESS_RESOLVE={pins}", "bash", "-e", "recipe.sh",
            cwd=str(tmp_path), timeout=600,
        )  # fmt: skip
    finally:
        await origin.close()
    assert rc == 0, out[-3000:] + err[-3000:]
    [trial] = [p for p in (tmp_path / "trials").iterdir() if p.is_dir()]
    agent = (trial / "agent" / "oracle.txt").read_text()
    assert "pypi=200" in agent, agent
    assert "example=000" in agent, agent  # the evaluator's block: no answer for the name
    assert [s.path for s in origin.seen] == ["/simple/"]


def test_twin_recipes_import_real_names(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A recipe that needs a model and an image runs as its twin; here, every name it imports
    must exist in the pinned framework (the issue's snippet had undefined names)."""
    _, twin, body = recipes()["verifiers-config"]
    assert twin == "tests/frameworks/test_verifiers_select.py"
    venv = framework_venv("verifiers", tmp_path_factory.getbasetemp())
    imports = [
        (node.module, alias.name)
        for node in ast.walk(ast.parse(body))
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    ]
    lines = ["import importlib, json", "missing = []"]
    for module, name in imports:
        found = f"hasattr(importlib.import_module({module!r}), {name!r})"
        lines.append(f"if not {found}: missing.append({module + '.' + name!r})")
    check = "\n".join([*lines, "print(json.dumps(missing))"])
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-c", check], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout) == [], proc.stdout
    assert len(imports) >= 6


async def _verified(audit: Path) -> None:
    rc, out, err = await run(sys.executable, "-m", "egress.cli", "audit", "verify", str(audit))
    assert rc == 0, out + err

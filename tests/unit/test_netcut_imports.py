"""Dependencies point inward: netcut's pure modules import no I/O library."""

from __future__ import annotations

import ast
import pathlib

import pytest

PURE = [
    "errors",
    "model",
    "ops",
    "plan",
    "status",
    "redirect",
    "render",
    "statedump",
    "verify",
    "targetref",
    "iptables_text",
]
FORBIDDEN = {"socket", "asyncio", "pyroute2", "iptc", "subprocess", "selectors"}
ROOT = pathlib.Path(__file__).resolve().parents[2] / "netcut"


def _imports(path: pathlib.Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module.split(".")[0])
            if node.module == "netcut":
                found |= {f"netcut.{a.name}" for a in node.names}
            elif node.module.startswith("netcut."):
                found.add(node.module)
    return found


@pytest.mark.parametrize("name", PURE)
def test_pure_module_imports_no_io(name: str) -> None:
    imported = _imports(ROOT / f"{name}.py")
    assert not imported & FORBIDDEN
    local = {m.split(".")[1] for m in imported if m.startswith("netcut.")}
    assert local <= set(PURE), f"{name} imports impure netcut modules {local - set(PURE)}"


def test_public_api_is_a_literal_all() -> None:
    import netcut

    tree = ast.parse((ROOT / "__init__.py").read_text())
    (assign,) = [
        n
        for n in tree.body
        if isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in n.targets)
    ]
    names = ast.literal_eval(assign.value)
    assert all(hasattr(netcut, n) for n in names)
    assert {"cut", "restore", "status", "probe", "cut_async", "CutResult"} <= set(names)

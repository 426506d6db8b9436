"""Dependencies point inward: the pure core imports no I/O (STYLE.md, "pure core")."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PURE = [
    "errors",
    "target",
    "policy",
    "addrs",
    "judge",
    "compose",
    "responses",
    "wire",
    "sni",
    "socks5",
    "dnsanswer",
    "config",
    "clients",
    "auditfmt",
    "validate",
]
FORBIDDEN = {
    "asyncio",
    "socket",
    "ssl",
    "selectors",
    "threading",
    "subprocess",
    "pyroute2",
    "iptc",
    "aiohttp",
    "netcut",
    "uvloop",
}


def imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            found.add("egress." + node.module.split(".")[0])
    return found


@pytest.mark.parametrize("name", PURE)
def test_pure_module_imports_no_io(name: str) -> None:
    mods = imported_modules(ROOT / "egress" / f"{name}.py")
    assert not mods & FORBIDDEN
    internal = {m.removeprefix("egress.") for m in mods if m.startswith("egress.")}
    assert internal <= set(PURE), f"{name} imports non-pure {internal - set(PURE)}"

"""The sans-I/O modules import nothing but the standard library and `egress.errors`.

Same idea as aiohttp's tests/test_circular_imports.py: the imports are read from the source,
so a forbidden import fails here even if it is never executed.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import egress

PURE_MODULES = ["http1", "fields", "request", "response", "tls_hello", "chunked", "rewrite"]
ALLOWED_PROJECT_IMPORTS = {
    "egress.errors",
    "egress.proxy.codec.http1",
    "egress.proxy.codec.fields",
    "egress.proxy.codec.request",
    "egress.proxy.codec.response",
}
FORBIDDEN_STDLIB = {"asyncio", "socket", "ssl", "selectors", "threading", "subprocess"}


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
        elif isinstance(node, ast.ImportFrom):
            raise AssertionError(f"{path.name}: use absolute imports")
    return names


@pytest.mark.parametrize("module", PURE_MODULES)
def test_pure_module_imports(module: str) -> None:
    path = Path(egress.__file__).parent / "proxy" / "codec" / f"{module}.py"
    for name in imported_modules(path):
        top = name.partition(".")[0]
        if name in ALLOWED_PROJECT_IMPORTS or top == "__future__":
            continue
        assert top in sys.stdlib_module_names, f"{module}.py imports {name}"
        assert top not in FORBIDDEN_STDLIB, f"{module}.py does I/O via {name}"

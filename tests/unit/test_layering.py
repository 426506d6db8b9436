"""Dependencies point inward: the pure core imports no I/O (docs/architecture.md)."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Which modules are pure is read from the tree, never from a list kept here: every module in
# a pure folder, and every other module whose docstring has a paragraph that opens "Pure".
PURE_FOLDERS = ["policy", "proxy/core", "proxy/codec", "proxy/modes"]
MODES = ROOT / "egress/proxy/modes"


def _mode_modules() -> frozenset[str]:
    """In `modes/`, a mode is one module named for its front-end (`http.py`, `socks5.py`...):
    its handshake and its connection's I/O; what every proxy loads, each mode as data (its
    answers by `Reason`, `kinds.py`), is pure (docs/architecture.md#egress-who-owns-what)."""
    from egress.proxy.modes.kinds import MODES, ROUTE

    return frozenset(f"{f.name}.py" for m in [*MODES.values(), ROUTE] for f in m.fronts)


MODE_MODULES = _mode_modules()


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT / "egress").with_suffix("")).replace("/", ".")


def _declares_pure(path: Path) -> bool:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return any(re.match(r"Pure\b", paragraph.strip()) for paragraph in doc.split("\n\n"))


IN_FOLDERS = [
    path
    for folder in PURE_FOLDERS
    for path in sorted((ROOT / "egress" / folder).rglob("*.py"))
    if path.parent != MODES or path.name not in MODE_MODULES
]
DECLARED = [
    path
    for path in sorted((ROOT / "egress").rglob("*.py"))
    if path not in IN_FOLDERS and _declares_pure(path)
]
PURE = [_name(path).removesuffix(".__init__") for path in [*IN_FOLDERS, *DECLARED]]


def source_of(name: str) -> Path:
    """The file of module `name` (a package's `__init__.py`)."""
    base = ROOT / "egress" / name.replace(".", "/")
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


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


def imported_modules(path: Path, module: str) -> set[str]:
    """Top-level names of everything `path` imports; egress modules as `egress.<dotted>`."""
    package = module.rpartition(".")[0].split(".") if "." in module else []
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.startswith("egress."):
                found.add(node.module)
            else:
                found.add(node.module.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - (node.level - 1)]
            if node.module:
                found.add("egress." + ".".join([*base, node.module]))
            else:
                found.update("egress." + ".".join([*base, a.name]) for a in node.names)
    return found


@pytest.mark.parametrize("name", PURE)
def test_pure_module_imports_no_io(name: str) -> None:
    path = source_of(name)
    mods = imported_modules(path, name if path.name != "__init__.py" else name + ".__init__")
    assert not mods & FORBIDDEN
    internal = {m.removeprefix("egress.") for m in mods if m.startswith("egress.")}
    assert internal <= set(PURE), f"{name} imports non-pure {internal - set(PURE)}"


def test_pure_folders_exist_and_say_what_they_hold() -> None:
    """A pure folder is a subpackage whose `__init__` says, in one sentence, what it holds."""
    for folder in [ROOT / "egress" / f for f in PURE_FOLDERS]:
        init = folder / "__init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc, folder
        assert doc.count(". ") == 0, f"{folder}: one sentence"
        assert doc.endswith("."), folder


def test_every_pure_module_exists() -> None:
    for name in PURE:
        assert source_of(name).is_file(), name


def test_a_mode_is_one_module_in_modes() -> None:
    """Only a mode's own module in `modes/` may do I/O: one module per mode, no subpackage,
    and the rest of `modes/` (its answers, `kinds.py`) checked as pure."""
    files = {p.name for p in MODES.glob("*.py")}
    assert MODE_MODULES & files, "modes/ has a module per mode"
    assert not [p for p in MODES.iterdir() if (p / "__init__.py").exists()]
    assert MODES / "kinds.py" in IN_FOLDERS
    for name in files - MODE_MODULES:
        assert MODES / name in IN_FOLDERS, name

"""Dependencies point inward: the pure core imports no I/O (docs/architecture.md)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PURE = [
    "errors",
    "config",
    "validate",
    "reasons",
    "policy.target",
    "policy.rules",
    "policy.ruleset",
    "policy.addrs",
    "policy.judge",
    "policy.compose",
    "policy.verifiers",
    "proxy.gate",
    "proxy.record",
    "proxy.responses",
    "proxy.wire",
    "proxy.wirefields",
    "proxy.wirerequest",
    "proxy.wireresponse",
    "proxy.chunked",
    "proxy.rewrite",
    "proxy.sni",
    "proxy.socks5",
    "proxy.dnsanswer",
    "proxy.clients",
    "proxy.metrics",
    "proxy.admission",
    "proxy.tally",
    "proxy.fdbudget",
    "audit.format",
    "audit.redact",
    "audit.timebounds",
    "audit.verify",
    "audit.suggest",
]
# folders pure as a whole: every module in them is checked, none listed by hand
PURE_FOLDERS = ["proxy/core", "proxy/modes"]
PURE += [
    str(path.relative_to(ROOT / "egress").with_suffix("")).replace("/", ".")
    for folder in PURE_FOLDERS
    for path in sorted((ROOT / "egress" / folder).glob("*.py"))
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
    path = ROOT / "egress" / (name.replace(".", "/") + ".py")
    mods = imported_modules(path, name)
    assert not mods & FORBIDDEN
    internal = {m.removeprefix("egress.") for m in mods if m.startswith("egress.")}
    assert internal <= set(PURE), f"{name} imports non-pure {internal - set(PURE)}"


def test_pure_folders_exist_and_say_what_they_hold() -> None:
    """A pure folder is a subpackage whose `__init__` says, in one sentence, what it holds."""
    for folder in PURE_FOLDERS:
        init = ROOT / "egress" / folder / "__init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc, folder
        assert doc.count(". ") == 0, f"{folder}: one sentence"
        assert doc.endswith("."), folder


def test_every_pure_module_exists() -> None:
    for name in PURE:
        assert (ROOT / "egress" / (name.replace(".", "/") + ".py")).is_file(), name

"""Dependencies point inward: netcut's pure modules import no I/O library, and the plan names
no netfilter backend's terms (docs/architecture.md#netcut-who-owns-what).

Which modules are pure is read from the tree, never from a list kept here: every module in
`netcut/plan/` by its folder, and every other module whose docstring says it is pure.
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

FORBIDDEN = {
    "socket",
    "asyncio",
    "pyroute2",
    "iptc",
    "subprocess",
    "selectors",
    "threading",
    "ctypes",
    "fcntl",
    "os",
}
ROOT = pathlib.Path(__file__).resolve().parents[2] / "netcut"
PLAN = sorted((ROOT / "plan").glob("*.py"))
# iptables' vocabulary: tools, tables, chains, jumps and targets. The plan says "backstop",
# "allow", "reject", "reset", "redirect" and "pass"; the backends say the rest.
IPTABLES_TERMS = re.compile(
    r"\b(?:ip6?tables\w*|iptc|xtables|libiptc|nftables|nft|chains?|jump(?:s|ed)?|hooks?"
    r"|OUTPUT|PREROUTING|POSTROUTING|ACCEPT|DROP|REJECT(?:-RST)?|RETURN|REDIRECT|MASQUERADE"
    r"|NETCUT(?:_REDIRECT)?|nat table|filter table|mangle|addrtype|conntrack)\b"
    r"|(?<![\w-])-[jtAIDNFX]\s|--(?:dport|dst-type|to-ports|reject-with)\b"
)


def _module(path: pathlib.Path) -> str:
    return ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)


def _self_declared_pure() -> list[pathlib.Path]:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        first = doc.split("\n\n")[0]
        if path.parent != ROOT / "plan" and re.search(r"\bPure\b", first):
            found.append(path)
    return found


PURE = [*PLAN, *_self_declared_pure()]
PURE_NAMES = {_module(p) for p in PURE}


def _imports(path: pathlib.Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            if node.module.startswith("netcut"):
                found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def test_the_plan_folder_and_the_self_declared_are_found() -> None:
    assert len(PLAN) >= 7, "netcut/plan/ holds the planning modules"
    pure = {"netcut.iptables_text", "netcut.iptables_shell", "netcut.helper.script"}
    assert pure | {"netcut.helper.dump"} <= PURE_NAMES


@pytest.mark.parametrize("path", PURE, ids=_module)
def test_pure_module_imports_no_io(path: pathlib.Path) -> None:
    imported = _imports(path)
    assert not {m.split(".")[0] for m in imported} & FORBIDDEN
    local = {m for m in imported if m.startswith("netcut.")}
    # a name imported from a pure module is fine; a module that is not pure is not
    impure = {m for m in local if m not in PURE_NAMES and m.rpartition(".")[0] not in PURE_NAMES}
    impure -= {"netcut.errors", "netcut.plan"} | {
        m for m in impure if m.startswith("netcut.errors.")
    }
    assert not impure, f"{_module(path)} imports impure netcut modules {impure}"


@pytest.mark.parametrize("path", PLAN, ids=_module)
def test_the_plan_names_no_iptables_terms(path: pathlib.Path) -> None:
    """Code, docstrings and comments alike: an nftables backend is one new module, and the
    plan is written for it as much as for iptables (docs/netcut.md#backends)."""
    lines = path.read_text().splitlines()
    found = [
        f"{i}: {line.strip()}" for i, line in enumerate(lines, 1) if IPTABLES_TERMS.search(line)
    ]
    assert not found, "\n".join(found)


def test_the_term_check_would_see_iptables() -> None:
    seen = ["chain NETCUT jumped to from OUTPUT", "-j ACCEPT", "iptables -t nat", "--dport 53"]
    for line in [*seen, 'FilterRule("REJECT-RST")']:
        assert IPTABLES_TERMS.search(line), line


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


def test_every_subpackage_init_is_one_sentence() -> None:
    for init in sorted(ROOT.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        sentence = " ".join(doc.split())
        assert sentence.endswith("."), (init, sentence)
        assert ". " not in sentence, (init, sentence)

"""The optional compiled build (docs/architecture.md#a-compiled-build): its module list, and
that a run knows which build it tests.

`./dev.sh compiled` runs the compiled modules' tests in a venv with a wheel built with
EGRESS_MYPYC=1 and sets EGRESS_EXPECT_COMPILED=1 there, so those tests cannot silently run
the pure-Python modules; everywhere else (the editable dev venv) every module must be the
`.py` file, or an edit would be shadowed by a stale compiled one.
"""

from __future__ import annotations

import ast
import importlib
import os
import runpy
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import egress
from egress.compiled import MODULES, compiled_modules, is_compiled
from egress.proxy.telemetry.admin import AdminServer
from egress.proxy.telemetry.metrics import ProxyMetrics

ROOT = Path(__file__).parents[2]
EXPECT_COMPILED = os.environ.get("EGRESS_EXPECT_COMPILED") == "1"
# the pure folders (no sockets, no asyncio: docs/architecture.md), which compile cleanly
PURE = ("egress/proxy/codec/", "egress/proxy/core/")


def test_this_run_tests_the_build_it_expects() -> None:
    """Compiled where EGRESS_EXPECT_COMPILED=1 says so, each module imported from its C
    extension; otherwise none (a plain or editable install)."""
    expected = MODULES if EXPECT_COMPILED else ()
    assert compiled_modules() == expected
    for name in MODULES:
        path = importlib.import_module(name).__file__
        assert path is not None
        assert path.endswith(tuple(EXTENSION_SUFFIXES)) is EXPECT_COMPILED, path


def test_no_other_module_of_the_package_is_compiled() -> None:
    """Exactly the listed modules have an extension where egress is installed: a wheel that
    also packed an earlier build's leftovers (a module no longer listed, linked against an
    older shared library) crashed with a segfault."""
    package = Path(egress.__file__).parent
    found = {
        ".".join(path.relative_to(package.parent).parts).split(".cpython")[0]
        for suffix in EXTENSION_SUFFIXES
        for path in package.rglob(f"*{suffix}")
    }
    assert found == (set(MODULES) if EXPECT_COMPILED else set())


def test_a_build_starts_from_no_earlier_outputs(tmp_path: Path) -> None:
    """setup.py removes build/lib* and build/bdist.* before building (setuptools would pack
    an earlier build's compiled modules into this wheel) and keeps build/temp.*'s objects."""
    remove = runpy.run_path(str(ROOT / "setup.py"), run_name="setup")["remove_earlier_outputs"]
    stale = [
        "build/lib/egress/proxy/codec/fields.cpython-311-x86_64-linux-gnu.so",
        "build/lib.linux-x86_64-cpython-311/egress/proxy/codec/http1.cpython-311-x86_64-linux-gnu.so",
        "build/bdist.linux-x86_64/wheel/egress/__init__.py",
    ]
    kept = "build/temp.linux-x86_64-cpython-311/build/fields.o"
    for name in [*stale, kept]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    assert len(remove(str(tmp_path))) == 3
    assert sorted(p.name for p in (tmp_path / "build").iterdir()) == [
        "temp.linux-x86_64-cpython-311"
    ]
    assert (tmp_path / kept).is_file()


def test_the_list_names_pure_modules_of_the_tree_once() -> None:
    assert len(set(MODULES)) == len(MODULES)
    assert list(MODULES) == sorted(MODULES)
    for name in MODULES:
        path = name.replace(".", "/") + ".py"
        assert (ROOT / path).is_file(), path
        assert path.startswith(PURE), path


def test_the_list_is_stdlib_only_for_setup_py() -> None:
    """setup.py runs egress/compiled.py by itself (no egress import, none of its
    dependencies in the build environment): only the standard library may be imported."""
    tree = ast.parse((ROOT / "egress/compiled.py").read_text())
    imported = {
        (node.module if isinstance(node, ast.ImportFrom) else alias.name).partition(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert imported == {"__future__", "importlib"}


def test_a_module_that_is_not_there_is_not_compiled() -> None:
    assert not is_compiled("egress.proxy.codec.no_such_module")
    assert not is_compiled("egress.compiled")  # the list itself is never compiled


def test_the_metrics_say_which_build_runs() -> None:
    """`egress_build_info` on /metrics (docs/metrics.md): the operator's way to tell."""
    registry = AdminServer(ProxyMetrics(), lambda: (True, "ok")).registry
    text = generate_latest(registry).decode()
    samples = [
        (s.labels, s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "egress_build_info"
    ]
    compiled = "true" if EXPECT_COMPILED else "false"
    assert samples == [({"version": egress.__version__, "compiled": compiled}, 1.0)]

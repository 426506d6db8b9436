"""Every example in README.md and docs/ that shows an expected output is run and its output
compared (docs/testing.md#examples-in-the-docs-are-tests). This file runs the ones that need
nothing (`egress check`, doctests); tests/integration/test_doc_examples_root.py runs the
ones marked `root` or `serve` in a fresh network namespace."""

from __future__ import annotations

import doctest
import re

import pytest

from docexamples import ROOT, examples, run_shell

PLAIN = [e for e in examples() if not e.needs]


def test_examples_are_found() -> None:
    found = examples()
    assert sum(e.kind == "shell" for e in found) >= 10
    assert any(e.kind == "doctest" for e in found)


@pytest.mark.parametrize("example", [e for e in PLAIN if e.kind == "shell"], ids=lambda e: e.name)
def test_shell_example(example) -> None:  # type: ignore[no-untyped-def]
    for command, expected, got in run_shell(example, ROOT):
        assert got == expected, f"{example.name}: $ {command}"


@pytest.mark.parametrize("example", [e for e in examples() if e.kind == "doctest"],
                         ids=lambda e: e.name)  # fmt: skip
def test_python_example(example) -> None:  # type: ignore[no-untyped-def]
    parser = doctest.DocTestParser()
    test = parser.get_doctest(example.body, {}, example.name, str(example.page), example.line)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    runner.run(test)
    assert runner.failures == 0, f"{example.name}: see the doctest report above"


def test_every_marked_example_is_run_somewhere() -> None:
    """`root` and `serve` run in the root tier; `ran-by TEST` names a test that exists."""
    for example in examples():
        kind = example.needs.split(" ", 1)[0]
        assert kind in ("", "root", "serve", "ran-by"), example.name
        if kind == "ran-by":
            target = example.needs.split(" ", 1)[1]
            path, _, name = target.partition("::")
            text = (ROOT / path).read_text()
            assert re.search(rf"def {re.escape(name)}\b", text), (example.name, target)

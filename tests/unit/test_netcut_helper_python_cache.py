"""The helper image's interpreter files (netcut/helper/image.py `python_files`) are asked of the
interpreter once per process: every helper operation names its image twice, and each question
started a process (two per prepare and two per release on the boundary's helper path:
docs/benchmarks.md#the-boundary-through-the-helper). A replaced interpreter is asked again."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from netcut.helper import image


def _count_runs(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The argv of every process `image` starts (the real `subprocess.run` still runs)."""
    seen: list[list[str]] = []
    real = subprocess.run

    def counted(argv: list[str], *a: object, **k: object) -> object:
        seen.append(list(argv))
        return real(argv, *a, **k)  # type: ignore[call-overload]

    monkeypatch.setattr(image.subprocess, "run", counted)
    return seen


def test_one_question_per_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    exe = os.path.realpath(sys.executable)
    monkeypatch.setattr(image, "_PYTHON_FILES", {})
    runs = _count_runs(monkeypatch)
    first = image._python_files_of(exe)
    assert first  # the interpreter answered: its files
    assert first[0] == exe
    assert image._python_files_of(exe) == first
    assert image._python_files_of(exe) == first
    assert len(runs) == 1


def test_a_replaced_interpreter_is_asked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = tmp_path / "python3"
    shutil.copy2(os.path.realpath(sys.executable), copy)
    monkeypatch.setattr(image, "_PYTHON_FILES", {})
    runs = _count_runs(monkeypatch)
    image._python_files_of(str(copy))
    st = copy.stat()
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    image._python_files_of(str(copy))
    assert len(runs) == 2
    copy.unlink()
    assert image._python_files_of(str(copy)) == ()  # gone: nothing, and no question
    assert len(runs) == 2

"""Optional mypyc build of the pure core (docs/architecture.md#a-compiled-build).

Everything else about the package is in pyproject.toml. By default this adds nothing: a plain
`pip install` needs no compiler and installs pure Python. With `EGRESS_MYPYC=1` in the
environment of a wheel build (`EGRESS_MYPYC=1 pip wheel .` or `pip install .`), the modules
listed in egress/compiled.py are compiled to C extensions by mypyc, which ships with mypy: a
build requirement only then, pinned to the version the code is type-checked with, beside the
runtime dependencies (for their types); the wheel needs nothing more at run time. The build
needs a C compiler and the Python headers (Debian: gcc, python3-dev).
"""

from __future__ import annotations

import glob
import os
import runpy
import shutil
import sys
import tomllib

# mypy's version whose mypyc the compiled build is tested with (./dev.sh compiled)
MYPY = "mypy==2.4.1"


def build_requirements() -> list[str]:
    """mypy, and the runtime dependencies: mypyc type-checks the modules it compiles and
    those they import as the dev checks do (strict), which needs their libraries' types."""
    with open("pyproject.toml", "rb") as f:
        return [MYPY, *tomllib.load(f)["project"]["dependencies"]]


# the setuptools commands that compile (the others ask for requirements or metadata)
BUILDS = frozenset({"bdist_wheel", "build", "build_ext", "install"})


def compiled_extensions() -> list[object]:
    """The mypyc extensions of egress/compiled.py's MODULES. setuptools runs this file once
    to ask for the build requirements (`setup_requires`, which the frontend then installs),
    once for the metadata and once to build: only the build compiles."""
    if "editable_wheel" in sys.argv:
        # an editable install imports the .py files from the tree; a compiled module there
        # would shadow them after an edit
        raise SystemExit("EGRESS_MYPYC=1: build a wheel (pip install .), not an editable install")
    if not BUILDS.intersection(sys.argv):
        return []
    try:
        from mypyc.build import mypycify
    except ImportError as exc:  # never a pure wheel when a compiled one was asked for
        raise SystemExit(
            f"EGRESS_MYPYC=1 needs {MYPY} in the build environment (pip installs it, "
            "unless --no-build-isolation)"
        ) from exc
    modules = runpy.run_path("egress/compiled.py")["MODULES"]
    paths = [name.replace(".", "/") + ".py" for name in modules]
    return list(mypycify(paths, opt_level="3"))


def remove_earlier_outputs(root: str = ".") -> list[str]:
    """Remove build/lib* and build/bdist.* (what the wheel is made of) before a build:
    setuptools packs whatever an earlier build left there, so a compiled module of an earlier
    EGRESS_MYPYC=1 build would ship in a pure wheel, or one no longer listed (linked against
    an older shared library: a segfault) in a compiled one. The C and object files of
    build/temp.* stay, so an unchanged module is not compiled again."""
    build = os.path.join(root, "build")
    paths = sorted(
        glob.glob(os.path.join(build, "lib*")) + glob.glob(os.path.join(build, "bdist.*"))
    )
    for path in paths:
        shutil.rmtree(path)
    return paths


if __name__ == "__main__":  # (setuptools runs it so; tests/unit/test_compiled.py imports it)
    # imported here: a test loads this file for its helpers where setuptools is not installed
    # (Python 3.12's venvs come without it)
    from setuptools import setup

    if BUILDS.intersection(sys.argv):
        remove_earlier_outputs()
    if os.environ.get("EGRESS_MYPYC") == "1":
        setup(setup_requires=build_requirements(), ext_modules=compiled_extensions())
    else:
        setup()

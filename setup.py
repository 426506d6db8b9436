"""Optional mypyc build of the pure core (docs/architecture.md#a-compiled-build).

Everything else about the package is in pyproject.toml. By default this adds nothing: a plain
`pip install` needs no compiler and installs pure Python. With `EGRESS_MYPYC=1` in the
environment of a wheel build (`EGRESS_MYPYC=1 pip wheel .` or `pip install .`), the modules
listed in egress/compiled.py are compiled to C extensions by mypyc, which ships with mypy (a
build requirement only then, pinned to the version the code is type-checked with; nothing is
added at run time). It needs a C compiler and the Python headers (Debian: gcc, python3-dev).
"""

from __future__ import annotations

import os
import runpy
import sys

from setuptools import setup

# mypy's version whose mypyc the compiled build is tested with (./dev.sh compiled)
MYPY = "mypy==2.4.1"


def compiled_extensions() -> list[object]:
    """The mypyc extensions of egress/compiled.py's MODULES, or none when mypy is not
    importable yet: setuptools runs this file once to ask for the build requirements
    (`setup_requires`, then installed by the frontend) and once to build."""
    if "editable_wheel" in sys.argv:
        # an editable install imports the .py files from the tree; a compiled module there
        # would shadow them after an edit
        raise SystemExit("EGRESS_MYPYC=1: build a wheel (pip install .), not an editable install")
    try:
        from mypyc.build import mypycify
    except ImportError:
        return []
    modules = runpy.run_path("egress/compiled.py")["MODULES"]
    paths = [name.replace(".", "/") + ".py" for name in modules]
    return list(mypycify(paths, opt_level="3"))


if os.environ.get("EGRESS_MYPYC") == "1":
    setup(setup_requires=[MYPY], ext_modules=compiled_extensions())
else:
    setup()

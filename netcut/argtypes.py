"""Typed arguments of netcut's public operations (docs/netcut.md#python-api).

Pure. A flag is a real `bool` (the string "false" is truthy, so `cut(target, force="false")`
would force), a timeout a finite number of seconds > 0, and a list of keeps a list, never
one string iterated as characters. Each error is an `InvalidType` (a `TypeError` and an
`InvalidInput`) that names the argument, raised before anything is opened.
"""

from __future__ import annotations

import math

from netcut.errors import InvalidType, InvalidValue


def check_flags(**flags: object) -> None:
    """Every value a real boolean."""
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise InvalidType(f"{name} must be a boolean (True or False), not {value!r}")


def check_seconds(value: object, name: str) -> float:
    """A finite number of seconds > 0 (a bool is not a number here)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidType(f"{name} must be a number of seconds, not {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise InvalidValue(f"{name} must be a finite number of seconds > 0, not {value!r}")
    return float(value)


def check_list(value: object, name: str) -> None:
    """A list or tuple (or other iterable), never one string, a number or None."""
    if isinstance(value, str | bytes | dict) or not hasattr(value, "__iter__"):
        raise InvalidType(f"{name} must be a list of ADDR[:PORT], not {value!r}")

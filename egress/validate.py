"""The one validator for configuration values, at every entry point (docs/policy.md#types).

Pure. The Python API (`Policy`, `Limits`, `EgressProxy`, `prepare_execution`), the policy
file, the command line and the framework mappings (`compose.from_harbor`/`from_verifiers`)
all check their values here, so a value means the same thing whichever way it came in:

- a boolean is a `bool` (the string "false" is an error, never truthy),
- a list of strings is a list or tuple of `str` (one string is an error, never iterated as
  characters),
- a timeout is a finite number of seconds greater than zero (nan, inf, 0 are errors),
- a count is an `int` of at least 1.

Every error names the field. `TypeError` for a value of the wrong type, `ValueError` for a
value of the right type out of range; callers that report user input (policy file, CLI)
turn both into one line.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

T = TypeVar("T")


def _kind(value: object) -> str:
    return type(value).__name__


def as_bool(value: object, field: str) -> bool:
    """`value` if it is a real boolean; `TypeError` naming `field` otherwise."""
    if not isinstance(value, bool):
        raise TypeError(f"{field} must be a boolean (true or false), not {_kind(value)} {value!r}")
    return value


def as_str(value: object, field: str, *, empty: bool = False) -> str:
    """`value` if it is a string (non-empty unless `empty`)."""
    if not isinstance(value, str):
        raise TypeError(f"{field} must be a string, not {_kind(value)} {value!r}")
    if not empty and not value:
        raise ValueError(f"{field} must not be empty")
    return value


def as_list(
    value: object, field: str, item_types: tuple[type, ...] = (str,), what: str = "strings"
) -> list[object]:
    """`value` as a list if it is a list, tuple (or other non-string iterable) of
    `item_types`; a single string or bytes is a `TypeError`, never iterated as characters."""
    if isinstance(value, str | bytes | bytearray | dict) or not isinstance(value, Iterable):
        raise TypeError(f"{field} must be a list of {what}, not {_kind(value)} {value!r}")
    items = list(value)
    for item in items:
        if not isinstance(item, item_types):
            raise TypeError(f"{field} must be a list of {what}; item {item!r} is {_kind(item)}")
    return items


def as_str_list(value: object, field: str) -> list[str]:
    """A list of strings (see `as_list`)."""
    return [str(v) for v in as_list(value, field)]


def as_timeout(value: object, field: str) -> float:
    """Seconds: a finite number greater than zero (a bool is not a number here)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{field} must be a number of seconds, not {_kind(value)} {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{field} must be a finite number of seconds > 0, not {value!r}")
    return float(value)


def as_count(value: object, field: str, *, minimum: int = 1) -> int:
    """An integer of at least `minimum` (a bool is not a number here)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{field} must be an integer, not {_kind(value)} {value!r}")
    if value < minimum:
        raise ValueError(f"{field} must be at least {minimum}, not {value}")
    return value


def as_port(value: object, field: str, *, zero: bool = True) -> int:
    """A TCP port: an integer 1-65535 (0 too, "any free port", when `zero`)."""
    port = as_count(value, field, minimum=0 if zero else 1)
    if port > 65535:
        raise ValueError(f"{field} must be at most 65535, not {port}")
    return port


def as_mapping(value: object, field: str) -> Mapping[object, object]:
    """A mapping (dict-like); a string, list or number is a `TypeError` naming `field`."""
    if not isinstance(value, Mapping):
        raise TypeError(f"{field} must be a mapping, not {_kind(value)} {value!r}")
    return value


def as_callables(value: object, field: str) -> list[Callable[..., object]]:
    """One callable or a list of them (None: none)."""
    if value is None:
        return []
    if callable(value):
        return [value]
    items = as_list(value, field, (object,), "callables")
    for item in items:
        if not callable(item):
            raise TypeError(f"{field} must be a callable or a list of them; {item!r} is not")
    return items  # type: ignore[return-value]


def as_choice(value: object, field: str, choices: tuple[str, ...]) -> str:
    """One of `choices` (strings)."""
    if not isinstance(value, str):
        raise TypeError(f"{field} must be one of {', '.join(choices)}, not {_kind(value)}")
    if value not in choices:
        raise ValueError(f"{field} must be one of {', '.join(choices)}, not {value!r}")
    return value


def as_table(value: object, field: str) -> dict[str, object]:
    """A mapping with string keys (a TOML table)."""
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise TypeError(f"{field} must be a table, not {_kind(value)} {value!r}")
    return value


def as_instance(value: object, field: str, cls: type[T] | tuple[type, ...], what: str) -> T:
    """`value` if it is an instance of `cls`; `TypeError` naming `field` and `what` otherwise."""
    if not isinstance(value, cls):
        raise TypeError(f"{field} must be {what}, not {_kind(value)} {value!r}")
    return value  # type: ignore[return-value]


__all__ = [
    "as_bool",
    "as_callables",
    "as_choice",
    "as_count",
    "as_instance",
    "as_list",
    "as_mapping",
    "as_port",
    "as_str",
    "as_str_list",
    "as_table",
    "as_timeout",
]

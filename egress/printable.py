"""Text that is safe to print to a terminal or a log line (docs/threat-model.md).

Pure. Whatever an agent chooses (a SOCKS name, a Host, a path, a client id in a reload
message) may end up in a human-readable line. Every code point that is not a visible
character or a plain space's kin is shown as an escape (`\\x1b`, `\\u202e`, `\\U000e0041`),
never passed through: control characters (C0, DEL, C1: ANSI escapes, and newlines that would
forge a whole line), the line and paragraph separators U+2028/U+2029 (a new line to many
viewers), format characters (the bidi controls that reorder text, zero-width characters, the
tag characters U+E0000-U+E007F that hide text in plain sight), surrogates, private-use and
unassigned code points: the Unicode categories Cc, Cf, Cs, Co, Cn, Zl and Zp, as the running
Python's `unicodedata` knows them. The audit log itself is JSON, whose encoder escapes
control characters already; every line *printed* goes through `printable`.

Cost: one C-level `str.isprintable` pass for the common case (nothing to escape); only a
string that holds a non-printable character is walked code point by code point.
"""

from __future__ import annotations

import unicodedata
from typing import Final

# the categories never printed as themselves (docs/threat-model.md)
UNSAFE_CATEGORIES: Final = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def _escape(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _shown(char: str) -> str:
    if char.isprintable() or unicodedata.category(char) not in UNSAFE_CATEGORIES:
        return char  # (str.isprintable is False for spaces other than " ": kept)
    return _escape(char)


def printable(text: str) -> str:
    """`text` with control, separator, format, private-use, surrogate and unassigned code
    points escaped; one line, always."""
    if text.isprintable():  # no Cc, Cf, Cs, Co, Cn, Zl, Zp (nor Zs but " ")
        return text
    return "".join(map(_shown, text))


__all__ = ["printable"]

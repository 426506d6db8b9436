"""Text that is safe to print to a terminal or a log line (docs/threat-model.md).

Pure. Whatever an agent chooses (a SOCKS name, a Host, a path, a client id in a reload
message) may end up in a human-readable line. Control characters (C0, DEL, C1: ANSI
escapes, and newlines that would forge a whole line) and the Unicode bidi controls that
reorder text are shown as escapes (`\\x1b`, `\\u202e`), never passed through. The audit log
itself is JSON, whose encoder escapes control characters already; every line *printed* goes
through `printable`.
"""

from __future__ import annotations

from typing import Final

_UNSAFE = [
    *range(0x20),
    *range(0x7F, 0xA0),
    0x061C,
    0x200E,
    0x200F,
    *range(0x202A, 0x202F),
    *range(0x2066, 0x206A),
]
_ESCAPES: Final = {code: f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" for code in _UNSAFE}


def printable(text: str) -> str:
    """`text` with terminal control and bidi characters escaped; one line, always."""
    return text.translate(_ESCAPES)


__all__ = ["printable"]

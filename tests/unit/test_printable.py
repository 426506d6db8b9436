"""`printable`: nothing an agent chooses reaches a terminal as a control, separator, format,
private-use, surrogate or unassigned code point (docs/threat-model.md)."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from egress.printable import printable

UNSAFE = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("a\x1b[31mb", "a\\x1b[31mb"),
        ("forged\nline", "forged\\x0aline"),
        ("\x85", "\\x85"),
        ("x\u202ey", "x\\u202ey"),
        ("line\u2028sep", "line\\u2028sep"),
        ("para\u2029sep", "para\\u2029sep"),
        ("tag\U000e0041\U000e007f", "tag\\U000e0041\\U000e007f"),
        ("zero\u200bwidth", "zero\\u200bwidth"),
        ("bom\ufeff", "bom\\ufeff"),
        ("private\ue000", "private\\ue000"),
        ("unassigned\U000e0080", "unassigned\\U000e0080"),
        ("surrogate\ud800", "surrogate\\ud800"),
        ("k\u00e4se.test caf\u00e9 \u00a0nbsp", "k\u00e4se.test caf\u00e9 \u00a0nbsp"),
        ("plain text", "plain text"),
    ],
    ids=[
        "ansi",
        "newline",
        "c1-nel",
        "bidi-override",
        "line-separator",
        "paragraph-separator",
        "tag-characters",
        "zero-width-space",
        "bom",
        "private-use",
        "unassigned",
        "surrogate",
        "letters-kept",
        "ascii-kept",
    ],
)
def test_escapes(text: str, shown: str) -> None:
    assert printable(text) == shown


@given(st.text(st.characters(codec=None, exclude_categories=())))
def test_output_has_no_unsafe_code_point(text: str) -> None:
    out = printable(text)
    assert not [c for c in out if unicodedata.category(c) in UNSAFE]


@given(st.text(st.characters(codec=None, exclude_categories=()), max_size=50))
def test_safe_text_is_unchanged(text: str) -> None:
    if not any(unicodedata.category(c) in UNSAFE for c in text):
        assert printable(text) == text


@pytest.mark.parametrize("code", [0x2028, 0x2029, 0xE0000, 0xE0001, 0xE0020, 0xE007F, 0x061C])
def test_every_listed_code_point_escaped(code: int) -> None:
    assert chr(code) not in printable(f"a{chr(code)}b")

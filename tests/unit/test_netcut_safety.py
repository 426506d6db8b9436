"""The privilege rail's judgement of one process (/proc status fields → findings). Pure."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from netcut.safety import dangerous_caps

FULL = "000001ffffffffff"
RAW = f"{1 << 13:016x}"
ADMIN_SYS = f"{(1 << 12) | (1 << 21):016x}"
NONE = "0000000000000000"


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"CapEff": NONE, "CapPrm": NONE, "CapBnd": NONE}, []),
        ({"CapEff": NONE, "CapPrm": NONE, "CapBnd": RAW}, ["CAP_NET_RAW (bounding)"]),
        ({"CapEff": NONE, "CapPrm": RAW, "CapBnd": NONE}, ["CAP_NET_RAW (permitted)"]),
        (
            {"CapEff": RAW, "CapPrm": RAW, "CapBnd": RAW},
            ["CAP_NET_RAW (effective, permitted, bounding)"],
        ),
        ({"CapEff": NONE, "CapPrm": NONE, "CapBnd": FULL, "NoNewPrivs": "1"}, []),
        (
            {"CapEff": RAW, "CapPrm": RAW, "CapBnd": FULL, "NoNewPrivs": "1"},
            ["CAP_NET_RAW (effective, permitted)"],
        ),
        (
            {"CapEff": NONE, "CapPrm": NONE, "CapBnd": ADMIN_SYS},
            ["CAP_NET_ADMIN (bounding)", "CAP_SYS_ADMIN (bounding)"],
        ),
        (
            {"CapEff": NONE, "CapPrm": NONE, "CapBnd": "zz"},
            ["CAP_NET_ADMIN (bounding)", "CAP_NET_RAW (bounding)", "CAP_SYS_ADMIN (bounding)"],
        ),
        ({}, []),
    ],
    ids=[
        "capless",
        "bounding-only",
        "permitted-only",
        "all-sets",
        "nnp-bounding-moot",
        "nnp-still-effective",
        "admin-and-sys",
        "unreadable-mask-fails-closed",
        "no-fields",
    ],
)
def test_dangerous_caps(fields: dict[str, str], expected: list[str]) -> None:
    assert dangerous_caps(fields) == expected


@given(
    st.dictionaries(
        st.sampled_from(["CapEff", "CapPrm", "CapBnd", "NoNewPrivs"]), st.text(max_size=20)
    )
)
def test_dangerous_caps_never_raises(fields: dict[str, str]) -> None:
    assert all(f.startswith("CAP_") for f in dangerous_caps(fields))

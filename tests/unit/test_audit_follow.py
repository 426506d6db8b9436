"""`tail -f`'s gap filler (egress/audit/follow.py): what it cannot find, it names exactly."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from egress.audit.follow import GapFiller


def _line(seq: int, **fields: object) -> bytes:
    return json.dumps({**fields, "seq": seq, "prev": "0" * 64}, separators=(",", ":")).encode()


def test_gap_warning_names_the_real_missing_range(tmp_path: Path) -> None:
    """Lines 3..7 went by unread; the rotated files still hold 5..7 (3 and 4 were removed):
    5..7 are shown, and the warning names 3..4 only (it used to say 3..7)."""
    path = tmp_path / "audit.jsonl"
    with gzip.open(f"{path}.1.gz", "wb") as out:
        out.write(b"\n".join(_line(s, type="rotate" if s == 5 else None) for s in (5, 6, 7)))
    warnings: list[str] = []
    gaps = GapFiller(str(path), warnings.append)
    shown = list(gaps.feed([_line(1), _line(2), _line(8, type="rotate"), _line(9)]))
    assert [json.loads(x)["seq"] for x in shown] == [1, 2, 5, 6, 7, 8, 9]
    assert len(warnings) == 1
    assert "2 line(s) (seq 3..4)" in warnings[0]


def test_a_line_read_twice_is_shown_once(tmp_path: Path) -> None:
    gaps = GapFiller(str(tmp_path / "audit.jsonl"), lambda _: None)
    lines = [_line(0, type="start"), _line(1), _line(2), _line(1), _line(2), _line(3)]
    assert [json.loads(x)["seq"] for x in gaps.feed(lines)] == [0, 1, 2, 3]
    # a new run starts at 0 again: not a repeat
    assert [json.loads(x)["seq"] for x in gaps.feed([_line(0, type="start"), _line(1)])] == [0, 1]

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


def test_tail_f_of_a_log_that_rotated_before_it_was_opened_starts_at_seq_0(tmp_path: Path) -> None:
    """`tail -f PATH` started before PATH existed; by the time it opened PATH the log had
    rotated, PATH starting with a `rotate` record at seq 2 (a CI run on a loaded machine
    showed 2, 3, ... and never 0 and 1). The lines in the rotated file come first."""
    path = tmp_path / "audit.jsonl"
    Path(f"{path}.1").write_bytes(_line(0, type="start") + b"\n" + _line(1) + b"\n")
    live = [_line(2, type="rotate"), _line(3)]
    wanted = GapFiller(str(path), lambda _: None, from_start=True)
    assert [json.loads(x)["seq"] for x in wanted.feed(live)] == [0, 1, 2, 3]
    # `tail -n 10 PATH` shows the end of a log, whatever rotated before it: no fill
    end_only = GapFiller(str(path), lambda _: None)
    assert [json.loads(x)["seq"] for x in end_only.feed(live)] == [2, 3]


def test_from_start_fills_only_before_the_first_record(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    Path(f"{path}.1").write_bytes(_line(0, type="start") + b"\n" + _line(1) + b"\n")
    gaps = GapFiller(str(path), lambda _: None, from_start=True)
    assert [json.loads(x)["seq"] for x in gaps.feed([_line(0, type="start"), _line(1)])] == [0, 1]
    # a new run's first rotate after its start is a normal gap check, not a fill from 0
    assert [json.loads(x)["seq"] for x in gaps.feed([_line(2, type="rotate")])] == [2]

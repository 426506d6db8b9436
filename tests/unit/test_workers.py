"""File names of `serve --workers` chains, and how the reviewer tools group them."""

from __future__ import annotations

from pathlib import Path

from egress.audit.read import chains, order_paths
from egress.workers import worker_audit_path


def test_worker_audit_path_inserts_the_worker_before_the_suffix() -> None:
    assert worker_audit_path("/x/audit.jsonl", 0) == "/x/audit.w0.jsonl"
    assert worker_audit_path("/x/a.b.log", 12) == "/x/a.b.w12.log"
    assert worker_audit_path("audit", 3) == "audit.w3"


def test_a_missing_name_stands_for_its_worker_files_in_worker_order(tmp_path: Path) -> None:
    for name in ("audit.w10.jsonl", "audit.w2.jsonl", "audit.w2.jsonl.1.gz", "other.w1.jsonl"):
        (tmp_path / name).write_bytes(b"")
    got = order_paths([str(tmp_path / "audit.jsonl")])
    assert [Path(p).name for p in got] == [
        "audit.w2.jsonl.1.gz",
        "audit.w2.jsonl",
        "audit.w10.jsonl",
    ]
    assert [[Path(p).name for p in c] for c in chains(got)] == [
        ["audit.w2.jsonl.1.gz", "audit.w2.jsonl"],
        ["audit.w10.jsonl"],
    ]


def test_an_existing_file_is_never_replaced_and_plain_files_stay_one_chain(
    tmp_path: Path,
) -> None:
    (tmp_path / "audit.jsonl").write_bytes(b"")
    (tmp_path / "audit.w0.jsonl").write_bytes(b"")
    given = [str(tmp_path / "audit.jsonl")]
    assert order_paths(given) == given
    plain = ["a.jsonl.1.gz", "a.jsonl", "b.jsonl"]
    assert chains(plain) == [plain]
    missing = str(tmp_path / "none.jsonl")
    assert order_paths([missing]) == [missing]  # the read then reports it missing

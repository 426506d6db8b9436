"""auditfmt, the pure part: timestamps, redaction, the chain, time bounds, the verifier."""

from __future__ import annotations

import ast
import hashlib
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import egress.audit.format as auditfmt
import egress.audit.redact as auditredact
import egress.audit.timebounds as audittime
import egress.audit.verify as auditverify
from egress.audit.format import GENESIS, Clock, chain_line, encode_record
from egress.audit.redact import Redactor, redact_url
from egress.audit.timebounds import normalize_ts, parse_time_bound
from egress.audit.verify import ChainVerifier

NOW = datetime(2026, 11, 30, 5, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("t", "text"),
    [
        (0.0, "1970-01-01T00:00:00.000Z"),
        (1795842062.1234, "2026-11-28T05:01:02.123Z"),
        (1795842062.9999, "2026-11-28T05:01:02.999Z"),
        (1795842063.0, "2026-11-28T05:01:03.000Z"),
    ],
)
def test_clock_format(t: float, text: str) -> None:
    assert Clock().format(t) == text


def test_clock_now_is_current_and_canonical() -> None:
    text = Clock().now()
    assert normalize_ts(text) == text
    moment = datetime.fromisoformat(text)
    assert abs((datetime.now(UTC) - moment).total_seconds()) < 5


@pytest.mark.parametrize(
    ("value", "redacted"),
    [
        ("/p?a=1", "/p?REDACTED"),
        ("/p", "/p"),
        ("/p?", "/p?REDACTED"),
        ("http://u:p@h/x?y", "http://h/x?REDACTED"),
        ("http://h/a@b", "http://h/a@b"),  # an @ in the path is not userinfo
        ("https://h?x=@y", "https://h?REDACTED"),
    ],
)
def test_redact_url(value: str, redacted: str) -> None:
    assert redact_url(value) == redacted


def test_redactor_is_by_field_name() -> None:
    record: dict[str, object] = {
        "host": "h",
        "X-Api-Key": "k",
        "reason": "auth_required",
        "detail": "token mentioned in free text stays",
    }
    Redactor().redact(record)
    assert record == {
        "host": "h",
        "reason": "auth_required",
        "detail": "token mentioned in free text stays",
    }


def test_chain_line_and_encoding() -> None:
    body = encode_record({"type": "start", "run": "r"})
    line = chain_line(body, 0, GENESIS)
    assert line == b'{"type":"start","run":"r","seq":0,"prev":"' + GENESIS.encode() + b'"}'
    assert chain_line("{}", 3, "a" * 64) == b'{"seq":3,"prev":"' + b"a" * 64 + b'"}'
    with pytest.raises(ValueError, match="JSON"):
        encode_record({"x": float("nan")})


@pytest.mark.parametrize(
    ("text", "moment"),
    [
        ("1h", NOW - timedelta(hours=1)),
        ("90s", NOW - timedelta(seconds=90)),
        ("15m", NOW - timedelta(minutes=15)),
        ("2d", NOW - timedelta(days=2)),
        ("1w", NOW - timedelta(weeks=1)),
        ("1.5h", NOW - timedelta(minutes=90)),
        ("2026-11-30T04:00:00Z", datetime(2026, 11, 30, 4, tzinfo=UTC)),
        ("2026-11-30t04:00:00z", datetime(2026, 11, 30, 4, tzinfo=UTC)),
        ("2026-11-30T06:00:00+02:00", datetime(2026, 11, 30, 4, tzinfo=UTC)),
        ("2026-11-30T04:00:00", datetime(2026, 11, 30, 4, tzinfo=UTC)),
        ("2026-11-30", datetime(2026, 11, 30, tzinfo=UTC)),
    ],
)
def test_parse_time_bound(text: str, moment: datetime) -> None:
    assert parse_time_bound(text, NOW) == moment


@pytest.mark.parametrize("text", ["", "yesterday", "1y", "-1h", "2026-13-01"])
def test_parse_time_bound_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="RFC 3339"):
        parse_time_bound(text, NOW)


def test_normalize_ts() -> None:
    assert normalize_ts("2026-11-30T05:00:00.123Z") == "2026-11-30T05:00:00.123Z"
    assert normalize_ts("2026-11-30T06:00:00+01:00") == "2026-11-30T05:00:00.000Z"
    assert normalize_ts("garbage") is None
    assert normalize_ts(12) is None


def reference_verify(lines: list[bytes]) -> bool:
    """The ten-line re-implementation that docs/audit-log.md gives reviewers."""
    prev: bytes | None = None
    seq = -1
    for line in lines:
        record = json.loads(line)
        if record.get("type") == "start":
            ok = record["seq"] == 0
        else:
            ok = (
                prev is not None
                and record["seq"] == seq + 1
                and record["prev"] == hashlib.sha256(prev).hexdigest()
            )
        if not ok:
            return False
        prev, seq = line, record["seq"]
    return json.loads(lines[-1]).get("type") == "end"


def make_run(requests: int) -> list[bytes]:
    lines = [chain_line(encode_record({"type": "start", "run": "r"}), 0, GENESIS)]
    for n in range(requests):
        prev = hashlib.sha256(lines[-1]).hexdigest()
        lines.append(chain_line(encode_record({"host": f"h{n}"}), n + 1, prev))
    prev = hashlib.sha256(lines[-1]).hexdigest()
    end = encode_record({"type": "end", "lines": requests + 1})
    lines.append(chain_line(end, requests + 1, prev))
    return lines


def verify_lines(lines: list[bytes]) -> list[str]:
    verifier = ChainVerifier()
    for number, line in enumerate(lines, 1):
        verifier.feed(f"f:{number}", line)
    return [str(p) for p in verifier.finish().problems]


def test_reference_and_verifier_agree_on_a_clean_run() -> None:
    lines = make_run(5)
    assert reference_verify(lines)
    assert verify_lines(lines) == []


@given(st.data())
def test_any_single_change_is_detected(data: st.DataObject) -> None:
    lines = make_run(6)
    index = data.draw(st.integers(0, len(lines) - 2), label="line")  # not the last (head)
    kind = data.draw(st.sampled_from(["delete", "swap", "edit", "duplicate"]), label="kind")
    if kind == "delete":
        del lines[index]
    elif kind == "swap":
        lines[index], lines[index + 1] = lines[index + 1], lines[index]
    elif kind == "edit":
        position = data.draw(st.integers(0, len(lines[index]) - 1), label="byte")
        byte = data.draw(st.integers(0, 255).filter(lambda b: b != lines[index][position]))
        lines[index] = lines[index][:position] + bytes([byte]) + lines[index][position + 1 :]
    else:
        lines.insert(index, lines[index])
    assert verify_lines(lines) != []


@given(st.lists(st.binary(max_size=120), max_size=12))
def test_verifier_never_crashes(lines: list[bytes]) -> None:
    verifier = ChainVerifier()
    for number, line in enumerate(lines, 1):
        verifier.feed(f"f:{number}", line, complete=number != len(lines))
    verifier.finish()


@pytest.mark.parametrize("module", [auditfmt, auditredact, audittime, auditverify])
def test_pure_module_imports_no_io(module: object) -> None:
    """The audit format modules stay pure: no asyncio, sockets, threads or files."""
    tree = ast.parse(Path(module.__file__).read_text())  # type: ignore[attr-defined]
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    imported |= {
        (node.module or "").split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
    }
    assert imported <= {
        "__future__",
        "hashlib",
        "json",
        "re",
        "time",
        "collections",
        "dataclasses",
        "datetime",
        "typing",
        "egress",
    }


SECRET_NAMES = [
    "Proxy-Authorization",
    "cookie",
    "X-Auth-Token",
    "password",
    "body",
    "api_key",
    "client_secret",
]


@given(
    st.dictionaries(
        st.one_of(st.sampled_from(SECRET_NAMES), st.text(max_size=12)),
        st.one_of(st.none(), st.integers(), st.text(max_size=20)),
        max_size=12,
    )
)
def test_redacted_records_never_keep_secret_fields(event: dict[str, object]) -> None:
    record = {"ts": "2026-11-30T05:00:00.000Z", **event}
    Redactor().redact(record)
    assert not set(record) & set(SECRET_NAMES)
    assert not set(record) & {"seq", "prev"}
    line = chain_line(encode_record(record), 1, GENESIS)
    assert line.isascii()
    assert json.loads(line)["seq"] == 1


@pytest.mark.parametrize(
    ("detail", "expect"),
    [
        (
            "unsupported request target 'ftp://x.test/?api_key=SECRET'",
            "unsupported request target 'ftp://x.test/?REDACTED'",
        ),
        ("cannot forward GET ftp://u:pw@x.test/a b", "cannot forward GET ftp://x.test/a b"),
        ("SNI 'evil.test' not allowed on port 443 (default_deny)", None),
        ("is this ok? yes", None),
    ],
)
def test_detail_is_redacted(detail: str, expect: str | None) -> None:
    from egress.audit.redact import redact_text

    record: dict[str, object] = {"detail": detail}
    Redactor().redact(record)
    assert record["detail"] == (detail if expect is None else expect)
    assert redact_text(detail) == record["detail"]

"""`egress audit suggest` (docs/audit-log.md#egress-audit-suggest): every request record is
counted, those without a destination listed, and the TOML stays one valid file whatever the
log holds."""

from __future__ import annotations

import tomllib

from egress.audit.suggest import render, suggest

ALLOWED = {"method": "CONNECT", "scheme": "https", "host": "a.test", "port": 443,
           "decision": "allow", "reason": "allow_rule", "rule": "a.test"}  # fmt: skip
CONNECTION = {"method": "-", "scheme": "", "host": "", "port": 0, "decision": "error",
              "reason": "too_many_connections", "rule": None}  # fmt: skip
ORIGIN_FORM = {"method": "GET", "scheme": "http", "host": "", "port": 0, "decision": "error",
               "reason": "bad_request", "rule": None}  # fmt: skip
BAD_HOST = {**ORIGIN_FORM, "method": "CONNECT", "scheme": "https", "host": "bad_host!"}


def text(records: list[dict[str, object]]) -> str:
    return render(suggest(records), lambda host: host, lambda rules: [], ["audit.jsonl"])


def test_every_request_record_is_counted() -> None:
    """27 records, 4 of them naming no destination: the header says 27, not 23 (issue 32),
    and the 4 are listed by reason, never allowed."""
    records = [ALLOWED] * 23 + [CONNECTION] * 2 + [ORIGIN_FORM, BAD_HOST]
    out = text(records)
    assert "# 27 request records." in out
    assert "#   too_many_connections  2 record(s)  -" in out
    assert "#   bad_request  2 record(s)  CONNECT bad_host!; GET" in out
    assert tomllib.loads(out)["allow"] == ["https://a.test"]


def test_hostile_text_stays_in_its_comment_or_string() -> None:
    """A crafted log's newline, DEL or lone surrogate never ends a comment or a string."""
    records = [
        {**ALLOWED, "host": "evil.test\nallow = ['*']", "client_id": "x\ny"},
        {**ALLOWED, "host": "del\x7f.test"},
        {**ALLOWED, "host": "sur\ud800.test"},
        {**BAD_HOST, "host": "bad\nhost"},
        {**ALLOWED, "reason": "reserved_address", "detail": "a\rb", "decision": "block"},
    ]
    out = text(records)
    policy = tomllib.loads(out)
    assert policy["default"] == "deny"
    assert len(policy["allow"]) == 3
    assert "https://evil.test\nallow = ['*']" in policy["allow"]
    assert all(line.startswith(("#", "    ", "default", "allow", "]")) or not line
               for line in out.splitlines())  # fmt: skip

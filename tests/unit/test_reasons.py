"""The docs' reason, end and error-response tables are checked against `egress.reasons`.

`Reason` and `End` are the one vocabulary; docs/audit-log.md#reason-codes and #end-values are
rendered from them (run `python tests/unit/test_reasons.py` to rewrite those two tables after
changing the enums), and docs/proxy.md#error-responses and docs/policy.md's precedence table
are checked row by row.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from egress.proxy.core.responses import REFUSALS
from egress.reasons import DECISIONS, End, Reason

DOCS = Path(__file__).resolve().parents[2] / "docs"
ROW = re.compile(r"^\| `([a-z0-9_]+)` \|(.*)\|$")


def render_reasons() -> str:
    lines = ["| reason | decision | meaning |", "| --- | --- | --- |"]
    lines += [f"| `{r.value}` | {r.decision} | {r.text} |" for r in Reason]
    return "\n".join(lines)


def render_ends() -> str:
    lines = ["| end | meaning |", "| --- | --- |"]
    lines += [f"| `{e.value}` | {e.text} |" for e in End]
    return "\n".join(lines)


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def _table_after(section: str, header: str) -> str:
    start = section.index(header)
    lines = []
    for line in section[start:].splitlines():
        if not line.startswith("|"):
            break
        lines.append(line)
    return "\n".join(lines)


def _rows(section: str) -> dict[str, list[str]]:
    rows = {}
    for line in section.splitlines():
        m = ROW.match(line)
        if m:
            rows[m.group(1)] = [c.strip() for c in m.group(2).split(" | ")]
    return rows


def test_audit_log_reason_table_is_the_vocabulary() -> None:
    section = _section((DOCS / "audit-log.md").read_text(), "Reason codes")
    assert _table_after(section, "| reason | decision |") == render_reasons()


def test_audit_log_end_table_is_the_vocabulary() -> None:
    section = _section((DOCS / "audit-log.md").read_text(), "End values")
    assert _table_after(section, "| end | meaning |") == render_ends()


def test_proxy_error_table_matches_the_answers() -> None:
    rows = _rows(_section((DOCS / "proxy.md").read_text(), "Error responses"))
    answered = {r.value for r in Reason if r.answered}
    assert set(rows) == answered
    for code, (status, error, _cause) in rows.items():
        assert status.split()[0] == str(Reason(code).status), code
        assert error == f"`{Reason(code).error}`", code


def test_policy_precedence_reasons_are_in_the_vocabulary() -> None:
    section = _section((DOCS / "policy.md").read_text(), "Precedence and reason codes")
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 5 and cells[0].isdigit():
            result, code = cells[2], cells[3].strip("`")
            assert Reason(code).decision == result


def test_refusals_come_from_the_vocabulary() -> None:
    assert set(REFUSALS) == {r.value for r in Reason if r.answered}
    assert {"sni_mismatch", "sni_missing", "dns_timeout"} <= set(REFUSALS)
    assert {r.decision for r in Reason} <= set(DECISIONS)


def _rewrite() -> None:  # pragma: no cover - a maintenance tool
    path = DOCS / "audit-log.md"
    text = path.read_text()
    for heading, header, render in (
        ("Reason codes", "| reason | decision |", render_reasons),
        ("End values", "| end | meaning |", render_ends),
    ):
        old = _table_after(_section(text, heading), header)
        text = text.replace(old, render())
    path.write_text(text)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(_rewrite())

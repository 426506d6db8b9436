"""Redaction: what a log line may never carry (docs/audit-log.md#redaction).

Pure. Fields named like a secret or a body are dropped; query strings (and URL userinfo)
are redacted in every field that can hold a URL, `detail` included (free text that may quote
the request target it refuses).
"""

from __future__ import annotations

import re
from typing import Final

from egress.audit.format import CHAIN_FIELDS

# A field whose name contains one of these (case-insensitive) is dropped from the record.
# Bodies too: a body is never logged, whatever its field is called.
_SECRET_KEY = re.compile(
    r"authoriz|cookie|token|passw|secret|api[-_]?key|body|payload", re.IGNORECASE
)
# Fields that may hold a URL or a request target; their query string is redacted. `detail`
# is free text that may quote one: its URLs are redacted by `redact_text`.
_URL_FIELDS: Final = ("path", "target", "uri", "url")
REDACTED_QUERY: Final = "?REDACTED"


class Redactor:
    """Drops secret-named fields and redacts query strings; memoizes the key decisions."""

    def __init__(self, keep_query: bool = False) -> None:
        self.keep_query = keep_query
        self._safe: set[str] = set()

    def _unsafe(self, key: str) -> bool:
        if key in self._safe:
            return False
        if key in CHAIN_FIELDS or _SECRET_KEY.search(key):
            return True
        if len(self._safe) < 4096:  # bound the memo against odd callers
            self._safe.add(key)
        return False

    def redact(self, record: dict[str, object]) -> None:
        """Redact `record` in place (the fast path is one C-level subset test)."""
        if not self._safe.issuperset(record):
            secret = [key for key in record if self._unsafe(key)]
            for key in secret:
                del record[key]
        if self.keep_query:
            return
        for key in _URL_FIELDS:
            value = record.get(key)
            if value.__class__ is str:
                record[key] = redact_url(value)
        detail = record.get("detail")
        if detail.__class__ is str and ("?" in detail or "@" in detail):
            record["detail"] = redact_text(detail)


def redact_url(value: str) -> str:
    """`/a?token=x` -> `/a?REDACTED`; also drops `user:pass@` from an absolute URL."""
    cut = value.find("?")
    if cut >= 0:
        value = value[:cut] + REDACTED_QUERY
    scheme_end = value.find("://")
    if scheme_end >= 0:
        rest = value[scheme_end + 3 :]
        at = rest.find("@")
        slash = rest.find("/")
        if at >= 0 and (slash < 0 or at < slash):
            value = value[: scheme_end + 3] + rest[at + 1 :]
    return value


# In free text (`detail` quotes the request target it refuses): a query string runs to the
# next space or quote; userinfo is what sits between `://` and `@`.
_TEXT_QUERY = re.compile(r"\?[^\s'\"]+")
_TEXT_USERINFO = re.compile(r"://[^/\s'\"@]*@")


def redact_text(value: str) -> str:
    """Redact every URL inside free text: `GET ftp://u:p@x/?key=1 'y'` -> `ftp://x/?REDACTED`."""
    value = _TEXT_USERINFO.sub("://", value)
    return _TEXT_QUERY.sub(REDACTED_QUERY, value)

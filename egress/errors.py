"""The few error types a caller of `egress` branches on.

A *denial* is not an error: it is a `Decision` (see `policy/rules.py`) that becomes a 403 at the
edge. Errors are for input that cannot be judged at all (a malformed host, a bad rule, a
malformed request) and carry the HTTP status the proxy answers with.

Pure: exception types only.
"""

from __future__ import annotations


class EgressError(Exception):
    """Base class of every error raised by `egress`."""


class PolicyError(EgressError):
    """A rule or policy file that cannot be loaded; the message quotes the culprit."""


class TargetError(EgressError):
    """A destination (host, authority, URL) that cannot be normalized, so it is refused.

    `status` is the HTTP status the proxy answers with (400 unless said otherwise).
    """

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class ProtocolError(EgressError):
    """A malformed or over-limit HTTP request head or body (400, or 431 for a large head)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status

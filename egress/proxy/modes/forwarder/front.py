"""The framework forwarder's front-end: a listener bound to one route, no handshake, no answer.

Pure. A forwarder connection is relayed to its framework route; whatever stops it (the audit
log, DNS, the dial) closes it unanswered: there is no protocol to answer in. Its records have
no `mode` (docs/audit-log.md).
"""

from __future__ import annotations

from typing import Final

from ....reasons import Reason
from ...core.intent import CLOSE, Front

FORWARDER: Final = Front("forwarder", None, "route", None, dict.fromkeys(Reason, CLOSE), 200)

__all__ = ["FORWARDER"]

"""The DNS front-end's answers: a query answered by rcode, one per `Reason`.

Pure, and free of dnspython (every proxy loads the listener modes; only a DNS listener loads
the codec, through `query.py`). The exchange's answer is the table's: a name the policy
refuses gets NXDOMAIN, a full pool SERVFAIL, a closed audit log REFUSED
(docs/proxy.md#transparent-mode-and-socks5); the table says so for every reason, so the audit
reasons and the rcodes cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from ....reasons import Reason
from ...core.intent import Answer, Front

NOERROR: Final = Answer("dns", 0)
FORMERR: Final = Answer("dns", 1)
SERVFAIL: Final = Answer("dns", 2)
NXDOMAIN: Final = Answer("dns", 3)
REFUSED: Final = Answer("dns", 5)

R = Reason
DNS_ANSWERS: Final[Mapping[Reason, Answer]] = {
    R.ALLOW_RULE: NOERROR,
    R.DEFAULT_ALLOW: NOERROR,
    R.FRAMEWORK_ROUTE: NOERROR,
    R.ADDRESS_RULES: NOERROR,  # answered; each connection judged on its address
    R.BLOCK_RULE: NXDOMAIN,
    R.DEFAULT_DENY: NXDOMAIN,
    R.PORT_NOT_ALLOWED: NXDOMAIN,
    R.RESERVED_ADDRESS: NXDOMAIN,
    R.NOT_A_NAME: NXDOMAIN,
    R.SNI_MISMATCH: NXDOMAIN,
    R.SNI_MISSING: NXDOMAIN,
    R.AUTH_REQUIRED: REFUSED,
    R.AUTH_FAILED: REFUSED,
    R.DNS_ERROR: SERVFAIL,
    R.DNS_TIMEOUT: SERVFAIL,
    R.CONNECTION_REFUSED: SERVFAIL,
    R.CONNECTION_TIMEOUT: SERVFAIL,
    R.UPSTREAM_ERROR: SERVFAIL,
    R.POOL_EXHAUSTED: SERVFAIL,
    # a malformed query: FORMERR (a non-standard opcode gets NOTIMP, a class other than IN
    # REFUSED, a name that is no name NXDOMAIN: the codec's `read_query` says which)
    R.BAD_REQUEST: FORMERR,
    R.HEAD_TOO_LARGE: FORMERR,
    R.HEAD_TIMEOUT: REFUSED,
    R.COMMAND_NOT_SUPPORTED: REFUSED,
    R.ADDRESS_TYPE_NOT_SUPPORTED: REFUSED,
    R.NOT_REDIRECTED: REFUSED,
    R.TOO_MANY_CONNECTIONS: REFUSED,
    R.AUDIT_UNAVAILABLE: REFUSED,
    R.IDENTIFY_TIMEOUT: REFUSED,
    R.EVICTED: REFUSED,
    R.SANDBOX_ADDED: NOERROR,
    R.SANDBOX_REPLACED: NOERROR,
    R.SANDBOX_REMOVED: REFUSED,
    R.LISTENER_PROBE: NOERROR,
}

# DNS records are transparent mode's, and record a closed audit log as `block`
# (docs/audit-log.md#dns-records)
DNS: Final = Front(
    "dns",
    "transparent",
    "lookup",
    None,
    DNS_ANSWERS,
    decisions={R.AUDIT_UNAVAILABLE: "block"},
)


__all__ = ["DNS", "DNS_ANSWERS"]

"""Known audit events for the audit tests and the docs walkthrough (counts are asserted)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

from egress.audit.log import AuditLog

# (count, event) pairs: the sample log's contents, in order.
SAMPLE: list[tuple[int, dict[str, object]]] = [
    (
        40,
        {
            "client": "198.18.0.2:41000",
            "client_id": "task-7",
            "method": "CONNECT",
            "scheme": "https",
            "host": "pypi.org",
            "port": 443,
            "decision": "allow",
            "reason": "allow_rule",
            "rule": "pypi.org",
            "addr": "198.18.7.10",
            "status": 200,
            "bytes_up": 2210,
            "bytes_down": 181000,
            "duration_ms": 840,
        },
    ),
    (
        25,
        {
            "client": "198.18.0.2:41001",
            "client_id": "task-7",
            "method": "CONNECT",
            "scheme": "https",
            "host": "files.pythonhosted.org",
            "port": 443,
            "decision": "allow",
            "reason": "allow_rule",
            "rule": "*.pythonhosted.org",
            "addr": "198.18.7.11",
            "status": 200,
            "bytes_up": 1900,
            "bytes_down": 2400000,
            "duration_ms": 2300,
        },
    ),
    (
        12,
        {
            "client": "198.18.0.2:41002",
            "client_id": "task-7",
            "method": "GET",
            "scheme": "http",
            "host": "api.model.internal",
            "port": 8080,
            "path": "/v1/chat?key=sk-1",
            "decision": "allow",
            "reason": "framework_route",
            "rule": "http://api.model.internal:8080",
            "addr": "198.18.0.1",
            "status": 200,
            "bytes_up": 5100,
            "bytes_down": 12000,
            "duration_ms": 950,
        },
    ),
    (
        9,
        {
            "client": "198.18.0.2:41003",
            "client_id": "task-7",
            "method": "CONNECT",
            "scheme": "https",
            "host": "github.com",
            "port": 443,
            "decision": "block",
            "reason": "default_deny",
            "rule": None,
            "status": 403,
            "detail": "no rule allows github.com:443 (default deny)",
        },
    ),
    (
        6,
        {
            "client": "198.18.0.2:41004",
            "client_id": "task-7",
            "method": "CONNECT",
            "scheme": "https",
            "host": "raw.githubusercontent.com",
            "port": 443,
            "decision": "block",
            "reason": "default_deny",
            "rule": None,
            "status": 403,
        },
    ),
    (
        5,
        {
            "client": "198.18.0.3:52000",
            "client_id": "task-8",
            "method": "CONNECT",
            "scheme": "https",
            "host": "pastebin.com",
            "port": 443,
            "decision": "block",
            "reason": "block_rule",
            "rule": "*.pastebin.com",
            "status": 403,
        },
    ),
    (
        4,
        {
            "client": "198.18.0.3:52001",
            "client_id": "task-8",
            "method": "GET",
            "scheme": "http",
            "host": "169.254.169.254",
            "port": 80,
            "path": "/latest/meta-data/iam?x=1",
            "decision": "block",
            "reason": "reserved_address",
            "rule": None,
            "status": 403,
            "detail": "169.254.169.254 is reserved (link_local)",
        },
    ),
    (
        3,
        {
            "client": "198.18.0.3:52002",
            "client_id": "task-8",
            "method": "CONNECT",
            "scheme": "https",
            "host": "pypi.org",
            "port": 443,
            "decision": "block",
            "reason": "sni_mismatch",
            "rule": None,
            "status": None,
            "detail": "SNI evil.example.net is not allowed on port 443",
        },
    ),
    (
        2,
        {
            "client": "198.18.0.3:52003",
            "client_id": "task-8",
            "method": "CONNECT",
            "scheme": "https",
            "host": "gist.github.com",
            "port": 443,
            "decision": "error",
            "reason": "dns_error",
            "rule": None,
            "status": 502,
            "detail": "gist.github.com: name does not resolve",
        },
    ),
    (
        1,
        {
            "client": "198.18.0.3:52004",
            "method": "CONNECT",
            "scheme": "https",
            "host": "pypi.org",
            "port": 22,
            "decision": "block",
            "reason": "port_not_allowed",
            "rule": None,
            "status": 403,
            "Proxy-Authorization": "Basic dGFzay04OnNlY3JldA==",
        },
    ),
]


def sample_events() -> Iterator[dict[str, object]]:
    port = 40000
    for count, event in SAMPLE:
        for _ in range(count):
            port += 1
            ip = str(event["client"]).split(":")[0]
            yield {**event, "client": f"{ip}:{port}"}


async def write_sample(path: str, **options: object) -> AuditLog:
    """Write the sample through the real writer; returns the closed log."""
    log = AuditLog(path, **options)  # type: ignore[arg-type]
    async with log:
        for event in sample_events():
            log.record(event)
            await asyncio.sleep(0)
    return log

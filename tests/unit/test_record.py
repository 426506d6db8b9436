"""The access record renders the audit line's fields in the order docs/audit-log.md shows."""

from __future__ import annotations

from egress.proxy.core.record import AccessRecord


def keys(ev: dict[str, object]) -> list[str]:
    return list(ev)


def test_allowed_request() -> None:
    rec = AccessRecord("127.0.0.1:5", "GET", "http", "x.test", 80, 1_000_000_000)
    rec.path = "/"
    rec.identify(None)
    rec.admitted("allow_rule", "x.test")
    rec.addr, rec.status = "198.18.0.1", 200
    rec.bytes_up, rec.bytes_down = 10, 20
    rec.finish(1_500_000_000)
    assert keys(rec.event("allow", "allow_rule", "x.test", None, 200)) == [
        "client",
        "method",
        "scheme",
        "host",
        "port",
        "path",
        "client_id",
        "rule",
        "reason",
        "addr",
        "status",
        "bytes_up",
        "bytes_down",
        "duration_ms",
        "decision",
    ]
    assert rec.duration_ms == 500.0
    rec.finish(1_000_223_456)  # nanoseconds in, microseconds out (never whole ms only)
    assert rec.duration_ms == 0.223


def test_tunnel_and_sni_refusal() -> None:
    rec = AccessRecord("c", "CONNECT", "https", "x.test", 443, 0)
    rec.identify("task")
    rec.admitted("allow_rule", "x.test")
    rec.addr, rec.status, rec.sni = "198.18.0.1", 200, "ok.test"
    rec.bytes_up, rec.bytes_down, rec.end = 1, 2, "eof"
    rec.finish(100_000_000)
    assert keys(rec.event("allow", "allow_rule", "x.test", None, 200)) == [
        "client",
        "method",
        "scheme",
        "host",
        "port",
        "client_id",
        "rule",
        "reason",
        "addr",
        "status",
        "sni",
        "bytes_up",
        "bytes_down",
        "end",
        "duration_ms",
        "decision",
    ]
    refused = AccessRecord("c", "CONNECT", "https", "x.test", 443, 0)
    refused.identify(None)
    refused.admitted("allow_rule", "x.test")
    refused.addr, refused.status, refused.sni = "198.18.0.1", 200, "evil.test"
    refused.finish(100_000_000)
    ev = refused.event("block", "sni_mismatch", None, "SNI 'evil.test' not allowed", 200)
    assert keys(ev) == [
        "client",
        "method",
        "scheme",
        "host",
        "port",
        "client_id",
        "rule",
        "reason",
        "addr",
        "status",
        "sni",
        "duration_ms",
        "decision",
        "detail",
    ]
    assert (ev["reason"], ev["rule"], ev["status"]) == ("sni_mismatch", None, 200)


def test_refusals() -> None:
    rec = AccessRecord("c", "GET", "http", "x.test", 80, 0)
    rec.path = "/"
    rec.identify(None)
    rec.finish(0)
    assert keys(rec.event("block", "default_deny", None, "no", 403)) == [
        "client",
        "method",
        "scheme",
        "host",
        "port",
        "path",
        "client_id",
        "duration_ms",
        "decision",
        "reason",
        "rule",
        "status",
        "detail",
    ]
    early = AccessRecord("c", "-", "", "", 0, 0)
    assert keys(early.event("error", "bad_request", None, "bad", 400)) == [
        "client",
        "method",
        "scheme",
        "host",
        "port",
        "decision",
        "reason",
        "rule",
        "status",
        "detail",
    ]


def test_forwarder() -> None:
    rec = AccessRecord("c", "FORWARD", "tcp", "127.0.0.1", 8080, 0)
    rec.identify("task")
    rec.addr = "127.0.0.1"
    rec.admitted("framework_route", "http://127.0.0.1:8080")
    rec.bytes_up, rec.bytes_down, rec.end = 1, 2, "eof"
    rec.finish(0)
    assert keys(rec.event("allow", "framework_route", "http://127.0.0.1:8080", None, 200)) == [
        "client",
        "method",
        "scheme",
        "host",
        "port",
        "client_id",
        "addr",
        "reason",
        "rule",
        "bytes_up",
        "bytes_down",
        "end",
        "duration_ms",
        "decision",
        "status",
    ]


def test_report_only_keeps_would_and_rule_after_a_failure() -> None:
    """A would-be block whose name then failed DNS: the record still says what the policy
    would have done (docs/audit-log.md#report-only-fields)."""
    rec = AccessRecord("c", "GET", "http", "blocked.test", 80, 0)
    rec.identify(None)
    rec.admitted("block_rule", "blocked.test")
    rec.would, rec.detail = "block", "report-only, would block: blocked by rule 'blocked.test'"
    ev = rec.event("error", "dns_error", None, "blocked.test: name does not resolve", 502)
    assert (ev["decision"], ev["reason"], ev["would"]) == ("error", "dns_error", "block")
    assert (ev["rule"], ev["would_reason"]) == ("blocked.test", "block_rule")
    assert ev["detail"] == (
        "report-only, would block: blocked by rule 'blocked.test'; "
        "then: blocked.test: name does not resolve"
    )
    # the address guard is not in report mode: its block carries no `would`
    ev = rec.event("block", "reserved_address", None, "127.0.0.1 is reserved", 403)
    assert "would" not in ev
    assert ev["rule"] is None

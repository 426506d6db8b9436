"""`egress audit export --format ocsf` (docs/audit-log.md#egress-audit-export): every record
shape the proxy writes becomes an event that validates against the published OCSF 1.7.0
schema with the `security_control` profile. The schema is ocsf-json-schema's packaged copy of
the OCSF server's export, turned into JSON Schema 2020-12 and checked with jsonschema, offline.
"""

from __future__ import annotations

import asyncio
import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from audit_samples import write_sample
from ocsf_json_schema import OcsfJsonSchemaEmbedded, get_ocsf_schema

from egress.audit.cli import audit_main
from egress.audit.log import AuditLog
from egress.audit.ocsf import (
    DNS_ACTIVITY,
    HTTP_ACTIVITY,
    NETWORK_ACTIVITY,
    OCSF_VERSION,
    PROFILES,
    to_ocsf,
)
from egress.proxy.core.record import AccessRecord

CLASSES = {HTTP_ACTIVITY: "http_activity", NETWORK_ACTIVITY: "network_activity",
           DNS_ACTIVITY: "dns_activity"}  # fmt: skip


@cache
def validator(class_uid: int) -> jsonschema.Draft202012Validator:
    schema = OcsfJsonSchemaEmbedded(get_ocsf_schema(version=OCSF_VERSION))
    js = schema.get_class_schema(class_name=CLASSES[class_uid], profiles=list(PROFILES))
    return jsonschema.Draft202012Validator(js)


def problems(event: dict[str, Any]) -> list[str]:
    return [
        f"{e.json_path}: {e.message[:200]}"
        for e in validator(event["class_uid"]).iter_errors(event)
    ]


def test_the_validator_rejects_what_the_schema_does_not_allow() -> None:
    """A check that cannot fail proves nothing: a typo'd field and a bad enum are caught."""
    good = to_ocsf(shapes()["connect_allowed"], "0.1.0")
    assert problems(good) == []
    assert problems({**good, "dst_endpont": {}})  # not an attribute of the class
    assert problems({**good, "activity_id": "Get"})  # not an integer enum value
    assert problems({k: v for k, v in good.items() if k != "metadata"})  # required


def shapes() -> dict[str, dict[str, object]]:
    """One record of every shape, made by the code that makes them (AccessRecord)."""
    out: dict[str, dict[str, object]] = {}
    tunnel = AccessRecord("198.18.0.2:40001", "CONNECT", "https", "pypi.org", 443, 0)
    tunnel.identify("task-7")
    tunnel.policy = "sha256:0123456789abcdef"
    tunnel.admitted("allow_rule", "pypi.org")
    tunnel.addr, tunnel.status, tunnel.sni = "198.18.7.10", 200, "pypi.org"
    tunnel.bytes_up, tunnel.bytes_down, tunnel.end = 10, 20, "eof"
    tunnel.finish(1_500_000)
    out["connect_allowed"] = tunnel.event("allow", "allow_rule", "pypi.org", None, 200)
    refused = AccessRecord("198.18.0.2:40002", "GET", "http", "evil.test", 80, 0)
    refused.path = "/x?REDACTED"
    refused.identify(None)
    refused.finish(200_000)
    out["get_blocked"] = refused.event(
        "block", "block_rule", "evil.test", "blocked by rule 'evil.test'", 403
    )
    failed = AccessRecord("198.18.0.2:40003", "POST", "http", "gone.test", 8080, 0)
    failed.admitted("default_deny", None)
    failed.would, failed.detail = "block", "report-only, would block: no allow rule matches"
    out["report_only_dns_error"] = failed.event("error", "dns_error", None, "no address", 502)
    socks = AccessRecord("198.18.0.2:40004", "CONNECT", "https", "git.test", 22, 0)
    socks.mode, socks.socks_reply = "socks5", 2
    out["socks_refused"] = socks.event("block", "port_not_allowed", None, "not on 22")
    transparent = AccessRecord("198.18.0.2:40005", "CONNECT", "https", "www.test", 443, 0)
    transparent.mode, transparent.orig_dst = "transparent", "198.19.0.1:443"
    transparent.admitted("allow_rule", "www.test")
    transparent.end = "client_closed"
    out["transparent_allowed"] = transparent.event("allow", "allow_rule", "www.test")
    forward = AccessRecord("127.0.0.1:40006", "FORWARD", "tcp", "127.0.0.1", 8089, 0)
    forward.admitted("framework_route", "http://127.0.0.1:8089")
    out["forwarder"] = forward.event("allow", "framework_route", "http://127.0.0.1:8089")
    early = AccessRecord("198.18.0.9:40007", "-", "", "", 0, 0)
    out["refused_before_a_request"] = early.event(
        "error", "too_many_connections", None, "over the limit", 503
    )
    out["dns_answered"] = {
        "client": "198.18.0.2:5353", "method": "DNS", "scheme": "dns", "host": "pypi.org",
        "port": 53, "mode": "transparent", "transport": "udp", "client_id": "task-7",
        "qtype": "A", "rcode": "NOERROR", "decision": "allow", "reason": "allow_rule",
        "rule": "pypi.org", "answer": "198.19.0.7",
    }  # fmt: skip
    out["dns_refused"] = {**out["dns_answered"], "host": "evil.test", "rcode": "NXDOMAIN",
                          "decision": "block", "reason": "default_deny", "rule": None}  # fmt: skip
    del out["dns_refused"]["answer"]
    for record in out.values():
        record["ts"], record["seq"], record["prev"] = "2026-11-30T05:01:02.123Z", 7, "0" * 64
    return out


RUN = "c531f3566e5b7d86305c15537a341ee5"

# carried in another form: ts as `time`, client as src_endpoint ip/port, decision as
# action/disposition/status, method as the activity, scheme in the class, rcode as rcode_id;
# seq/prev are the chain
_DECOMPOSED = frozenset({"ts", "prev", "seq", "decision", "scheme", "client", "method", "rcode"})


@pytest.mark.parametrize("shape", sorted(shapes()))
def test_every_record_shape_is_a_valid_ocsf_event(shape: str) -> None:
    record = shapes()[shape]
    event = to_ocsf(record, "0.1.0")
    assert problems(event) == []
    assert event["time"] == 1796014862123
    assert event["metadata"]["product"]["name"] == "egress"  # type: ignore[index]
    # nothing the record said is lost: mapped, or kept under `unmapped`
    text = json.dumps(event)
    for key, value in record.items():
        if key not in _DECOMPOSED and value not in (None, ""):
            assert json.dumps(value) in text or str(value) in text, (key, value)


def test_the_mapping_field_by_field() -> None:
    """The table in docs/audit-log.md#egress-audit-export, checked on one record each."""
    s = shapes()
    connect = to_ocsf(s["connect_allowed"], "0.1.0", run=RUN)
    assert (connect["class_uid"], connect["activity_id"], connect["type_uid"]) == (4002, 1, 400201)
    assert connect["src_endpoint"] == {"ip": "198.18.0.2", "port": 40001, "uid": "task-7"}
    assert connect["dst_endpoint"] == {"hostname": "pypi.org", "port": 443, "ip": "198.18.7.10"}
    url = {"hostname": "pypi.org", "scheme": "https", "port": 443, "url_string": "pypi.org:443"}
    assert connect["http_request"] == {"http_method": "CONNECT", "url": url}
    assert connect["traffic"] == {"bytes_out": 10, "bytes_in": 20}
    assert (connect["action_id"], connect["disposition_id"], connect["status_id"]) == (1, 1, 1)
    assert connect["firewall_rule"] == {"name": "pypi.org", "desc": "allow_rule"}
    assert connect["policy"] == {"uid": "sha256:0123456789abcdef", "name": "egress policy"}
    assert connect["duration"] == 2  # 1.5 ms, OCSF's whole milliseconds
    assert connect["unmapped"] == {"sni": "pypi.org", "end": "eof", "duration_ms": 1.5}
    assert connect["metadata"]["uid"] == f"{RUN}:7"  # type: ignore[index]
    assert connect["metadata"]["correlation_uid"] == RUN  # type: ignore[index]
    get = to_ocsf(s["get_blocked"], "0.1.0", run=RUN)
    assert (get["activity_id"], get["action_id"], get["disposition_id"]) == (3, 2, 2)
    assert get["http_request"]["url"]["url_string"] == "http://evil.test:80/x?REDACTED"  # type: ignore[index]
    assert (get["http_response"], get["status_code"]) == ({"code": 403}, "block_rule")
    assert get["message"] == "blocked by rule 'evil.test'"
    would = to_ocsf(s["report_only_dns_error"], "0.1.0", run=RUN)
    assert (would["disposition_id"], would["status_code"]) == (27, "dns_error")
    assert would["unmapped"] == {"would": "block", "would_reason": "default_deny"}
    socks = to_ocsf(s["socks_refused"], "0.1.0", run=RUN)
    assert (socks["class_uid"], socks["activity_id"]) == (4001, 5)  # Network Activity: Refuse
    assert socks["unmapped"] == {"mode": "socks5", "socks_reply": 2}
    assert to_ocsf(s["forwarder"], "0.1.0", run=RUN)["activity_id"] == 2  # Close
    assert to_ocsf(s["refused_before_a_request"], "0.1.0", run=RUN)["activity_id"] == 4  # Fail
    dns = to_ocsf(s["dns_answered"], "0.1.0", run=RUN)
    assert (dns["class_uid"], dns["activity_id"], dns["rcode_id"]) == (4003, 2, 0)
    assert dns["query"] == {"hostname": "pypi.org", "type": "A", "class": "IN"}
    assert dns["answers"] == [{"rdata": "198.19.0.7", "type": "A", "class": "IN"}]
    assert to_ocsf(s["dns_refused"], "0.1.0", run=RUN)["rcode_id"] == 3


def test_export_the_sample_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "audit.jsonl"
    asyncio.run(write_sample(str(path), rotate_bytes=8000))
    files = sorted(str(p) for p in tmp_path.iterdir())
    assert audit_main(["export", "--format", "ocsf", *files]) == 0
    out, err = capsys.readouterr()
    events = [json.loads(line) for line in out.splitlines()]
    assert len(events) == 107  # the sample's request records (docs walkthrough)
    for event in events:
        assert problems(event) == [], event
    assert "left out (not requests)" in err


# ---- issue 32: odd methods, who decided, address targets, unique ids -----------------------


@pytest.mark.parametrize("method", ["PROPFIND", "X-EXFIL", "get", "Get", "BREW"])
def test_a_method_outside_the_schemas_enum_is_a_valid_other_event(method: str) -> None:
    """`http_method` is an enum of the nine RFC 9110/5789 methods: any other (methods are
    case-sensitive, so `get` too) is activity 99 Other, named by `activity_name`, with the
    raw method under `unmapped`: a validating pipeline keeps exactly the agent's odd
    requests."""
    event = to_ocsf({**shapes()["get_blocked"], "method": method}, "0.1.0")
    assert problems(event) == []
    assert (event["activity_id"], event["type_uid"]) == (99, 400299)
    assert event["activity_name"] == method
    assert event["type_name"] == "HTTP Activity: Other"
    assert "http_method" not in event["http_request"]  # type: ignore[operator]
    assert event["unmapped"]["http_method"] == method  # type: ignore[index]


@pytest.mark.parametrize(
    ("reason", "rule", "name"),
    [
        ("reserved_address", None, "(address guard)"),
        ("sni_mismatch", None, "(TLS SNI check)"),
        ("sni_missing", None, "(TLS SNI check)"),
        ("default_deny", None, "(default posture)"),
        ("block_rule", "evil.test", "evil.test"),
        ("port_not_allowed", None, "(default posture)"),
        ("dns_error", None, None),
    ],
)
def test_the_firewall_rule_names_who_decided(reason: str, rule: str | None, name: str) -> None:
    decision = "error" if reason == "dns_error" else "block"
    record = {**shapes()["get_blocked"], "reason": reason, "rule": rule, "decision": decision}
    event = to_ocsf(record, "0.1.0")
    assert problems(event) == []
    assert event.get("firewall_rule") == ({"name": name, "desc": reason} if name else None)


@pytest.mark.parametrize(
    ("host", "ip"),
    [("169.254.169.254", "169.254.169.254"), ("2001:db8::1", "2001:db8::1"), ("a.test", None)],
)
def test_an_address_target_has_its_ip_even_when_never_dialed(host: str, ip: str | None) -> None:
    record = {**shapes()["get_blocked"], "host": host, "reason": "reserved_address"}
    record.pop("addr", None)
    event = to_ocsf(record, "0.1.0")
    assert problems(event) == []
    assert event["dst_endpoint"].get("ip") == ip  # type: ignore[attr-defined]


def test_sequence_and_uid_never_repeat_across_runs_and_workers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two runs in one file and two workers' files: every record's `seq` repeats, the
    events' `metadata.sequence` and `metadata.uid` do not; `correlation_uid` is the run id
    of the record's start record."""
    event = {"client": "198.18.0.2:1", "method": "GET", "scheme": "http", "host": "a.test",
             "port": 80, "decision": "allow", "reason": "allow_rule", "rule": "a.test"}  # fmt: skip

    async def write(path: Path, worker: tuple[int, int] | None) -> str:
        async with AuditLog(str(path), worker=worker) as log:
            for _ in range(3):
                log.record(event)
        return log.run_id

    runs = [asyncio.run(write(tmp_path / "audit.w0.jsonl", (0, 2))) for _ in range(2)]
    runs.append(asyncio.run(write(tmp_path / "audit.w1.jsonl", (1, 2))))
    assert audit_main(["export", "--format", "ocsf", str(tmp_path / "audit.jsonl")]) == 0
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(events) == 9
    meta = [e["metadata"] for e in events]
    assert [m["sequence"] for m in meta] == list(range(1, 10))
    assert len({m["uid"] for m in meta}) == 9
    assert [m["correlation_uid"] for m in meta] == [r for r in runs for _ in range(3)]
    assert meta[0]["uid"] == f"{runs[0]}:1"  # RUN:SEQ, the record's place in its chain
    for e in events:
        assert problems(e) == []

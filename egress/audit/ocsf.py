"""`egress audit export --format ocsf`: audit records as OCSF 1.7.0 events, for SIEMs
(docs/audit-log.md#egress-audit-export).

One request record becomes one event: a DNS query answered by transparent mode's responder
is **DNS Activity** (4003); a plain-HTTP request or a CONNECT tunnel through the HTTP proxy is
**HTTP Activity** (4002, activity by method: CONNECT is `Connect`); a SOCKS5 or transparent
tunnel, a framework-route forwarder connection and a refusal before any request (a
connection record) are **Network Activity** (4001: `Close` for a connection that was let
through and ended, `Refuse` for a block, `Fail` for an error). Control and lifecycle
records are no network activity and are left out (the caller counts them).

The events use the `security_control` profile (declared in `metadata.profiles`), which carries
the verdict: `action_id`/`disposition_id` (allowed or blocked), `firewall_rule` (the rule that
decided and the reason code) and `policy` (the policy hash). What OCSF has no attribute for
(the reason code, `would`, `end`, `mode`, ...) is kept under `unmapped`, so nothing the
record said is lost. The mapping, field by field, is the table in docs/audit-log.md; the test
validates every shape against the published schema (ocsf-json-schema's copy, offline).

Pure: records in, events out.
"""

from __future__ import annotations

import ipaddress
from datetime import datetime
from typing import Final

OCSF_VERSION: Final = "1.7.0"
PROFILES: Final = ("security_control",)
CATEGORY_NETWORK: Final = 4

HTTP_ACTIVITY: Final = 4002
NETWORK_ACTIVITY: Final = 4001
DNS_ACTIVITY: Final = 4003
_CLASS_NAMES: Final = {
    HTTP_ACTIVITY: "HTTP Activity",
    NETWORK_ACTIVITY: "Network Activity",
    DNS_ACTIVITY: "DNS Activity",
}
_HTTP_METHODS: Final = {
    "CONNECT": (1, "Connect"),
    "DELETE": (2, "Delete"),
    "GET": (3, "Get"),
    "HEAD": (4, "Head"),
    "OPTIONS": (5, "Options"),
    "POST": (6, "Post"),
    "PUT": (7, "Put"),
    "TRACE": (8, "Trace"),
    "PATCH": (9, "Patch"),
}
# who decided when no rule did (`rule` is null): the default posture only for the default
# reasons; the address guard, the SNI check or authentication for theirs
# (docs/audit-log.md#reason-codes); any other null-rule record (an error) names no decider
_DECIDED_BY: Final = {
    "default_deny": "(default posture)",
    "default_allow": "(default posture)",
    "reserved_address": "(address guard)",
    "sni_mismatch": "(TLS SNI check)",
    "sni_missing": "(TLS SNI check)",
    "auth_required": "(proxy authentication)",
    "auth_failed": "(proxy authentication)",
    "not_a_name": "(DNS responder: an address spelling)",
}
_NETWORK: Final = {"allow": (2, "Close"), "block": (5, "Refuse"), "error": (4, "Fail")}
_RCODES: Final = {
    "NOERROR": (0, "NoError"),
    "FORMERR": (1, "FormError"),
    "SERVFAIL": (2, "ServError"),
    "NXDOMAIN": (3, "NXDomain"),
    "NOTIMP": (4, "NotImp"),
    "REFUSED": (5, "Refused"),
}
# decision -> (action_id, action, disposition_id, disposition, status_id, status, severity_id)
_VERDICT: Final = {
    "allow": (1, "Allowed", 1, "Allowed", 1, "Success", 1),
    "block": (2, "Denied", 2, "Blocked", 2, "Failure", 3),
    "error": (2, "Denied", 27, "Error", 2, "Failure", 2),
}
_SEVERITY: Final = {1: "Informational", 2: "Low", 3: "Medium"}
# record fields that a mapped attribute carries whole; the others go to `unmapped`
_MAPPED: Final = frozenset(
    {
        "ts",
        "client",
        "client_id",
        "method",
        "scheme",
        "host",
        "port",
        "path",
        "addr",
        "bytes_up",
        "bytes_down",
        "decision",
        "reason",
        "rule",
        "policy",
        "detail",
        "qtype",
        "rcode",
        "answer",
        "seq",
        "prev",
    }
)


def event_class(record: dict[str, object]) -> int:
    """The OCSF class of a request record (docs/audit-log.md#egress-audit-export)."""
    method = str(record.get("method") or "")
    if method == "DNS":
        return DNS_ACTIVITY
    if record.get("mode") in ("socks5", "transparent", "forward") or method in ("FORWARD", "-"):
        return NETWORK_ACTIVITY
    if not record.get("host"):
        return NETWORK_ACTIVITY
    return HTTP_ACTIVITY


def to_ocsf(
    record: dict[str, object],
    product_version: str,
    *,
    run: str | None = None,
    sequence: int | None = None,
) -> dict[str, object]:
    """One request record (not control, not lifecycle) as one OCSF event.

    `run` is the id of the record's run (its `start` record's `run`): it becomes the event's
    `metadata.correlation_uid`, and with the record's `seq` its `metadata.uid`
    (`RUN:SEQ`, unique across runs and workers). `sequence` is the event's position in the
    export, `metadata.sequence` (a record's `seq` restarts at 0 in every run and worker, so
    it is no sequence of the export; it is in the uid)."""
    cls = event_class(record)
    event = _header(record, cls, product_version)
    event["metadata"] = _metadata(record, product_version, run, sequence)
    reason = record.get("reason")
    if isinstance(reason, str):
        event["status_code"] = reason
    if record.get("detail"):
        event["message"] = event["status_detail"] = str(record["detail"])
    _endpoints(record, cls, event)
    _measures(record, event)
    name = _decider(record)
    if name is not None:  # (the schema wants a name or uid in a firewall_rule)
        event["firewall_rule"] = {
            "name": name,
            **({"desc": reason} if isinstance(reason, str) and reason else {}),
        }
    if record.get("policy"):
        event["policy"] = {"uid": str(record["policy"]), "name": "egress policy"}
    if cls == HTTP_ACTIVITY:
        _http(record, event)
    elif cls == DNS_ACTIVITY:
        _dns(record, event)
    # `status` is HTTP Activity's (`http_response.code`); `duration_ms` keeps its microseconds
    # (OCSF's `duration` is whole milliseconds)
    extra = {
        k: v
        for k, v in record.items()
        if k not in _MAPPED and not (k == "status" and cls == HTTP_ACTIVITY)
    }
    method = record.get("method")
    if cls == HTTP_ACTIVITY and method not in _HTTP_METHODS:
        extra["http_method"] = method  # the schema's enum has no such method: kept raw here
    metadata = event["metadata"]
    if isinstance(metadata, dict) and "uid" not in metadata and record.get("seq") is not None:
        extra["seq"] = record["seq"]  # no run known: the chain's seq kept as it is
    if extra:
        event["unmapped"] = extra
    return event


def _header(record: dict[str, object], cls: int, product_version: str) -> dict[str, object]:
    """The fields every event opens with: its class and activity, time, verdict."""
    decision = str(record.get("decision") or "error")
    verdict = _VERDICT.get(decision, _VERDICT["error"])
    if cls == DNS_ACTIVITY:
        activity = (2, "Response")
    elif cls == HTTP_ACTIVITY:
        # methods are case-sensitive (RFC 9110 9.1): `get` is no GET. Any other method is
        # 99 Other, whose `activity_name` is the source's own value (the schema says so)
        method = str(record.get("method"))
        activity = _HTTP_METHODS.get(method, (99, method))
    else:
        activity = _NETWORK.get(decision, (4, "Fail"))
    return {
        "category_uid": CATEGORY_NETWORK,
        "category_name": "Network Activity",
        "class_uid": cls,
        "class_name": _CLASS_NAMES[cls],
        "activity_id": activity[0],
        "activity_name": activity[1],
        "type_uid": cls * 100 + activity[0],
        "type_name": f"{_CLASS_NAMES[cls]}: {activity[1] if activity[0] != 99 else 'Other'}",
        "time": _epoch_ms(record.get("ts")),
        "severity_id": verdict[6],
        "severity": _SEVERITY[verdict[6]],
        "action_id": verdict[0],
        "action": verdict[1],
        "disposition_id": verdict[2],
        "disposition": verdict[3],
        "status_id": verdict[4],
        "status": verdict[5],
    }


def _metadata(
    record: dict[str, object], product_version: str, run: str | None, sequence: int | None
) -> dict[str, object]:
    seq = record.get("seq")
    out: dict[str, object] = {
        "version": OCSF_VERSION,
        "profiles": list(PROFILES),
        "product": {"name": "egress", "vendor_name": "egress-netcut", "version": product_version},
        "log_name": "egress audit log",
    }
    if run:
        out["correlation_uid"] = run  # every event of one run (one worker's chain)
        if type(seq) is int:
            out["uid"] = out["original_event_uid"] = f"{run}:{seq}"
    if sequence is not None:
        out["sequence"] = sequence
    return out


def _endpoints(record: dict[str, object], cls: int, event: dict[str, object]) -> None:
    """`src_endpoint` (the client) and `dst_endpoint` (not for DNS: its answer says it)."""
    src = _endpoint_of_client(record)
    if src:
        event["src_endpoint"] = src
    dst: dict[str, object] = {}
    if record.get("host"):
        dst["hostname"] = str(record["host"])
    if isinstance(record.get("port"), int) and record["port"]:
        dst["port"] = record["port"]
    if record.get("addr"):
        dst["ip"] = str(record["addr"])
    elif _is_address(record.get("host")):  # refused before any dial: the target says it
        dst["ip"] = str(record["host"]).strip("[]")
    if dst and cls != DNS_ACTIVITY:
        event["dst_endpoint"] = dst


def _measures(record: dict[str, object], event: dict[str, object]) -> None:
    """How long it took and how many bytes went each way."""
    if isinstance(record.get("duration_ms"), int | float):
        event["duration"] = round(float(record["duration_ms"]))  # type: ignore[arg-type]
    if record.get("bytes_up") is not None or record.get("bytes_down") is not None:
        event["traffic"] = {
            "bytes_out": int(record.get("bytes_up") or 0),  # type: ignore[call-overload]
            "bytes_in": int(record.get("bytes_down") or 0),  # type: ignore[call-overload]
        }


def _http(record: dict[str, object], event: dict[str, object]) -> None:
    host, port = str(record.get("host") or ""), record.get("port")
    method = str(record.get("method") or "")
    scheme = "https" if method == "CONNECT" else str(record.get("scheme") or "http")
    path = str(record["path"]) if record.get("path") is not None else ""
    shown = f"[{host}]" if ":" in host else host
    authority = f"{shown}:{port}" if isinstance(port, int) and port else shown
    url: dict[str, object] = {"hostname": host, "scheme": scheme}
    if isinstance(port, int) and port:
        url["port"] = port
    if method == "CONNECT":
        url["url_string"] = authority  # a tunnel's target is an authority, not a URL
    else:
        url["url_string"] = f"{scheme}://{authority}{path}"
        if path:
            url["path"] = path.split("?", 1)[0]
    request: dict[str, object] = {"url": url}
    if method in _HTTP_METHODS:  # the schema's enum; any other is under `unmapped`
        request["http_method"] = method
    event["http_request"] = request
    if isinstance(record.get("status"), int):
        event["http_response"] = {"code": record["status"]}
        event["http_status"] = record["status"]


def _dns(record: dict[str, object], event: dict[str, object]) -> None:
    query: dict[str, object] = {"hostname": str(record.get("host") or "")}
    if record.get("qtype"):
        query["type"] = str(record["qtype"])
    query["class"] = "IN"
    event["query"] = query
    rcode = _RCODES.get(str(record.get("rcode") or ""), None)
    if rcode is not None:
        event["rcode_id"], event["rcode"] = rcode
    elif record.get("rcode"):
        event["rcode_id"], event["rcode"] = 99, str(record["rcode"])
    if record.get("answer"):
        event["answers"] = [
            {"rdata": str(record["answer"]), "type": str(record.get("qtype") or "A"), "class": "IN"}
        ]
    event["dst_endpoint"] = {"port": 53, "svc_name": "dns"}


def _decider(record: dict[str, object]) -> str | None:
    """The rule that decided, or who did when no rule did: a verdict with a null rule is the
    default posture's unless its reason names another decider (the address guard, the SNI
    check, authentication); an error with neither decided nothing (None)."""
    rule = record.get("rule")
    if rule is not None:
        return str(rule)
    reason = str(record.get("would_reason") or record.get("reason"))
    if reason in _DECIDED_BY:
        return _DECIDED_BY[reason]
    return "(default posture)" if record.get("decision") in ("allow", "block") else None


def _is_address(host: object) -> bool:
    try:
        ipaddress.ip_address(str(host).strip("[]"))
    except ValueError:
        return False
    return True


def _endpoint_of_client(record: dict[str, object]) -> dict[str, object]:
    """`198.18.0.2:41000` / `[2001:db8::1]:5` as `{ip, port}`, plus the client's identity."""
    text = str(record.get("client") or "")
    out: dict[str, object] = {}
    host, sep, port = text.rpartition(":")
    if sep and port.isdigit() and host:
        out["ip"], out["port"] = host.strip("[]"), int(port)
    if record.get("client_id"):
        out["uid"] = str(record["client_id"])
    return out


def _epoch_ms(ts: object) -> int:
    """RFC 3339 `2026-11-30T05:01:02.123Z` as milliseconds since the epoch (0 if absent)."""
    if not isinstance(ts, str):
        return 0
    try:
        moment = datetime.fromisoformat(ts.replace("Z", "+00:00"))
    except ValueError:
        return 0
    return int(moment.timestamp() * 1000)


__all__ = ["DNS_ACTIVITY", "HTTP_ACTIVITY", "NETWORK_ACTIVITY", "event_class", "to_ocsf"]

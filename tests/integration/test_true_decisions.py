"""What the proxy decides is what the record says (issue: reviewer's counts): no DNS lookup
for a refusal no answer could change, report-only keeps its verdict after a DNS failure,
and a blocked `ws://` attempt is the policy's refusal, not a 400.

The proxy listens on 127.0.0.1 and its resolver is a recording function: no name leaves
this machine, and the test sees every lookup the proxy asked for.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterable
from pathlib import Path

import aiohttp
import pytest

import egress
from egress import EgressProxy
from egress.config import build_settings, load_policy_file
from egress.proxy.net.resolve import Resolver

from proxykit import MemoryAudit, raw_exchange

EXAMPLE = Path(egress.__file__).parent / "examples" / "policy.toml"


class RecordingDNS:
    """A resolver function that answers nothing and remembers what it was asked."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def lookup(self, host: str) -> Iterable[str]:
        self.asked.append(host)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")


async def test_example_policy_refuses_unknown_names_without_a_lookup() -> None:
    dns = RecordingDNS()
    audit = MemoryAudit()
    settings = build_settings(load_policy_file(str(EXAMPLE)))
    async with EgressProxy(settings, audit=audit, resolver=Resolver(lookup=dns.lookup)) as proxy:
        host, port = proxy.addresses[0]
        get = b"GET http://unknown.demo/ HTTP/1.1\r\nHost: unknown.demo\r\nConnection: close\r\n"
        reply = await raw_exchange(host, port, get + b"\r\n")
        connect = await raw_exchange(host, port, b"CONNECT unknown.demo:443 HTTP/1.1\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 403"), reply[:80]
    assert connect.startswith(b"HTTP/1.1 403"), connect[:80]
    assert [e["reason"] for e in audit.events] == ["default_deny", "default_deny"]
    assert dns.asked == []  # the block CIDR cannot make a refusal an allow: nothing to ask


async def test_report_only_dns_failure_keeps_would_and_rule() -> None:
    dns = RecordingDNS()
    audit = MemoryAudit()
    settings = build_settings({"block": ["blocked.test"], "mode": "report"})
    async with EgressProxy(settings, audit=audit, resolver=Resolver(lookup=dns.lookup)) as proxy:
        host, port = proxy.addresses[0]
        reply = await raw_exchange(
            host, port, b"GET http://blocked.test/ HTTP/1.1\r\nHost: blocked.test\r\n\r\n"
        )
    assert reply.startswith(b"HTTP/1.1 502"), reply[:80]
    [event] = audit.events
    assert (event["decision"], event["reason"]) == ("error", "dns_error")
    assert (event["would"], event["would_reason"], event["rule"]) == (
        "block",
        "block_rule",
        "blocked.test",
    )
    assert "would block: blocked by rule 'blocked.test'" in str(event["detail"])


async def test_a_blocked_websocket_attempt_is_the_policys_refusal(tmp_path: Path) -> None:
    audit = MemoryAudit()
    settings = build_settings({"allow": ["ok.test"], "block": ["blocked.test"]})
    dns = RecordingDNS()
    async with EgressProxy(settings, audit=audit, resolver=Resolver(lookup=dns.lookup)) as proxy:
        async with aiohttp.ClientSession() as session:
            with pytest.raises(aiohttp.WSServerHandshakeError) as blocked:
                await session.ws_connect("ws://blocked.test/chat", proxy=proxy.url)
            with pytest.raises(aiohttp.WSServerHandshakeError) as unknown:
                await session.ws_connect("ws://nobody.test:9000/chat", proxy=proxy.url)
            with pytest.raises(aiohttp.WSServerHandshakeError) as allowed:
                await session.ws_connect("ws://ok.test/chat", proxy=proxy.url)
    assert (blocked.value.status, unknown.value.status) == (403, 403)
    assert allowed.value.status == 400  # allowed, but ws:// cannot go through: use wss://
    by_host = {e["host"]: e for e in audit.events}
    assert (by_host["blocked.test"]["reason"], by_host["blocked.test"]["rule"]) == (
        "block_rule",
        "blocked.test",
    )
    assert (by_host["nobody.test"]["reason"], by_host["nobody.test"]["port"]) == (
        "default_deny",
        9000,
    )
    assert by_host["ok.test"]["reason"] == "bad_request"
    assert "use wss://" in str(by_host["ok.test"]["detail"])
    assert dns.asked == []
    json.dumps(audit.events)  # every record is plain JSON

"""A DNS server under the test's control that records every query it receives: what the
proxy asked its resolver is on the wire, not in a mock (docs/policy.md#no-lookup-decides-nothing).
"""

from __future__ import annotations

import asyncio
from typing import cast

import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset


class QueryLog(asyncio.DatagramProtocol):
    """A DNS server over UDP that records every query it receives (name and type) and answers
    A queries for the names in its table; any other name is NXDOMAIN."""

    def __init__(self, table: dict[str, str]) -> None:
        self.table = table
        self.asked: list[tuple[str, str]] = []
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        try:
            query = dns.message.from_wire(data)
            question = query.question[0]
        except Exception:  # a garbled datagram is recorded as such and dropped
            self.asked.append(("<garbled>", "?"))
            return
        name = question.name.to_text().rstrip(".").lower()
        self.asked.append((name, dns.rdatatype.to_text(question.rdtype)))
        response = dns.message.make_response(query)
        address = self.table.get(name)
        if address is None:
            response.set_rcode(dns.rcode.NXDOMAIN)
        elif question.rdtype == dns.rdatatype.A:
            response.answer.append(dns.rrset.from_text(question.name, 5, "IN", "A", address))
        assert self.transport is not None
        self.transport.sendto(response.to_wire(), addr)

    def names(self) -> set[str]:
        return {name for name, _ in self.asked}

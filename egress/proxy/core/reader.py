"""The response half of a request's exchange: read once, decided once, for both drivers.

Pure. h11's readers in small: `ResponseReader.read(buf, eof)` takes what the upstream has
sent so far and says what it means, so the coroutine path (`modes/http.py`) and the
callback fast path (`drive/callback.py`) only move bytes:

- `None`: a head is not complete yet, read on;
- `INTERIM`: a 1xx (not 101) to relay to the client as it came (`raw`), then read on;
- `FINAL`: the final head, with everything that follows from it decided here: the head as
  the client gets it (`out`: the upstream's own bytes when nothing needs rewriting, else
  rewritten with `Connection: close` or `keep-alive` as the two sides require), whether
  the client connection may go on once the body is relayed cleanly (`keep`), whether the
  upstream may go back to the pool then (`reuse`), and the body's framing;
- a refusal to answer with: the exchange's own (`Refuse`: a 101, docs/proxy.md#websocket),
  or the upstream's failure (`Verdict`): a malformed head, a close before a response, or
  `UNANSWERED`, a pooled upstream that closed before a byte of one (the one failure a
  request may be retried after: `Exchange.retry`, docs/proxy.md#upstream-pool).

A driver reads with it once it reported the request head `sent` (the exchange then awaits
its response); each head's status goes to the exchange (`Exchange.response`), which
records it and refuses a 101 (`gate.response_step`): docs/architecture.md#one-exchange.
"""

from __future__ import annotations

from enum import Enum
from typing import Final

from ...errors import ProtocolError
from ..codec import http1 as wire
from ..codec import rewrite
from .actions import Refuse
from .exchange import Exchange
from .gate import Verdict, refuse_upstream

# a pooled upstream closed before a byte of its response: the one refusal a request may be
# answered with a retry on a fresh connection instead (docs/proxy.md#upstream-pool)
UNANSWERED: Final = refuse_upstream("upstream closed before a response")
CLOSED: Final = refuse_upstream("upstream closed before a response")


class Read(Enum):
    """What `ResponseReader.read` found (besides need-more and a refusal)."""

    INTERIM = "interim"  # relay `raw`, read on
    FINAL = "final"  # the final head: `head`, `out`, `keep`, `reuse`


INTERIM: Final = Read.INTERIM
FINAL: Final = Read.FINAL


class ResponseReader:
    """Reads one request's response heads and decides what each means (the module docstring).

    `request`: the request head as the client sent it (its method frames the response; its
    keep-alive and version shape what the client is sent); `closing`: the proxy is stopping,
    so no connection is kept alive."""

    __slots__ = (
        "closing",
        "head",
        "interim",
        "keep",
        "out",
        "raw",
        "request",
        "reuse",
        "searched",
        "used",
        "x",
    )

    def __init__(self, x: Exchange, request: wire.RequestHead, closing: bool) -> None:
        self.x = x
        self.request = request
        self.closing = closing
        self.searched = 0  # bytes already scanned for a head's end (no quadratic rescans)
        self.interim = False  # a 1xx was relayed: a retry no longer may
        self.raw = b""  # the last head's bytes, as the upstream sent them
        self.used = 0  # ...and how many of `buf` they were (the driver consumes them)
        self.head: wire.ResponseHead | None = None  # the final head, once read
        self.out = b""  # the final head as the client gets it
        self.keep = False  # the client connection may go on after a clean body
        self.reuse = False  # the upstream may go back to the pool after a clean body

    def read(self, buf: bytearray, eof: bool) -> Read | Refuse | Verdict | None:
        """The next head in `buf` (`eof`: the upstream ended after it), or None for more.
        Never raises for any bytes: a head that cannot be read is a `Verdict`."""
        try:
            parsed = wire.parse_response_head(
                buf, request_method=self.request.method, searched=self.searched
            )
        except ProtocolError as exc:
            return refuse_upstream(f"malformed response: {exc}")
        if parsed is None:
            if eof:  # not a byte of a response: may retry; else cut short
                return UNANSWERED if not buf and not self.interim else CLOSED
            self.searched = len(buf)
            return None
        head, used = parsed
        raw = self.raw = bytes(buf[:used])
        self.used = used
        step = self.x.response(head.status)
        if isinstance(step, Refuse):  # a 101
            return step
        if head.status < 200:  # interim: relayed, and read on
            self.searched = 0
            self.interim = True
            return INTERIM
        self.head = head
        self._decide(head, raw)
        return FINAL

    def _decide(self, head: wire.ResponseHead, raw: bytes) -> None:
        """Keep-alive, pooling and the head the client gets, from the final head."""
        request = self.request
        keep = request.keep_alive and head.keep_alive and not self.closing
        # an until-close body ends with the upstream's close: neither side goes on after it
        self.keep = keep and head.framing.kind != "close"
        self.reuse = head.keep_alive
        out = None
        if keep and request.version == "HTTP/1.1":
            out = rewrite.passthrough_response_head(head, raw)
        if out is None:
            fields = rewrite.forward_response_headers(head)
            if not keep:
                fields.append(("Connection", "close"))
            elif request.version == "HTTP/1.0":
                fields.append(("Connection", "keep-alive"))
            out = rewrite.serialize_response_head(head.status, head.reason, fields)
        self.out = out


__all__ = ["CLOSED", "FINAL", "INTERIM", "UNANSWERED", "Read", "ResponseReader"]

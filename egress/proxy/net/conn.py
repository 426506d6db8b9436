"""One client connection: its state, its limits, reading a request head, its timeouts.

Shell (the state holds sockets), but no policy: `Conn` is what the sweeper and the audit
lines need to know about a connection; `Limits` bounds it (docs/proxy.md#limits);
`read_head` buffers and parses one request head (`wire`); `sweep` enforces the head, hello
and idle timeouts from the server's one sweeper task, so no timer is armed per operation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from ...errors import ProtocolError
from ...reasons import End
from ...validate import as_count, as_timeout
from ..codec import http1 as wire
from ..core.gate import HEAD_TIMEOUT
from ..core.record import AccessRecord
from ..core.responses import error_response
from .dialer import Dialer
from .listener import Listener
from .relay import Side

if TYPE_CHECKING:
    from ...policy.rules import Policy

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Limits:
    """Resource bounds; the defaults are documented (docs/proxy.md#limits) and relied upon."""

    max_head: int = wire.MAX_REQUEST_HEAD_SIZE  # 16 KiB, h11's precedent
    max_headers: int = wire.MAX_REQUEST_HEADERS  # 100
    head_timeout: float = 10.0
    connect_timeout: float = 10.0
    idle_timeout: float = 300.0
    max_connections: int = 1024
    shutdown_grace: float = 5.0
    pool_idle: float = 30.0  # idle upstream keep-alive connections are closed after this
    pool_per_key: int = 64
    # connections one client (client id, else source address) may hold; None = a quarter
    # of max_connections (at least 1)
    max_client_connections: int | None = None
    # not-yet-identified connections on a shared listener (tokens, --require-auth): per
    # source address (also capped at a quarter of max_connections), and how long they may
    # stay unidentified (docs/proxy.md#limits)
    max_unidentified: int = 64
    identify_timeout: float = 3.0
    # forward-proxy requests of one client in flight at once while another client is
    # present; the next waits for one of its own to end (fairshare.py,
    # docs/proxy.md#fair-share); None = no cap
    max_client_inflight: int | None = 8

    def __post_init__(self) -> None:
        """Timeouts finite and > 0, counts >= 1, whatever the entry point (docs/proxy.md#limits)."""
        for name in (
            "head_timeout",
            "connect_timeout",
            "idle_timeout",
            "shutdown_grace",
            "pool_idle",
            "identify_timeout",
        ):
            as_timeout(getattr(self, name), f"Limits {name}")
        for name in (
            "max_head",
            "max_headers",
            "max_connections",
            "pool_per_key",
            "max_unidentified",
        ):
            as_count(getattr(self, name), f"Limits {name}")
        if self.max_client_connections is not None:
            as_count(self.max_client_connections, "Limits max_client_connections")
        if self.max_client_inflight is not None:
            as_count(self.max_client_inflight, "Limits max_client_inflight")

    @property
    def client_cap(self) -> int:
        if self.max_client_connections is not None:
            return self.max_client_connections
        return max(1, self.max_connections // 4)

    @property
    def unidentified_total(self) -> int:
        """Unidentified connections in all: never more than a quarter of the proxy."""
        return max(1, self.max_connections // 4)

    @property
    def unidentified_per_source(self) -> int:
        return min(self.max_unidentified, self.unidentified_total)


@dataclass(slots=True, eq=False)
class Conn:
    """One client connection's state, for the sweeper and the audit lines."""

    side: Side
    client: str
    peer: object  # the socket's peername; parsed only when a source rule needs it
    listener: Listener
    phase: str = "head"  # head | idle | active | hello
    raw_head: bytes = b""  # the bytes of the request head being served
    phase_since: float = 0.0
    upstream: Side | None = None
    end: str | None = None
    orig_dst: str | None = None  # transparent mode: where the client was going (ip:port)
    owner: object = None  # the per-client cap's key, once the client is known (admission.py)
    served: bool = False  # an exchange (which writes its own record) began on it
    # the record of the tunnel it relays, or of the plain-HTTP exchange in flight or last
    # dialed: a policy change re-judges it (tenants.py, docs/policy.md#live-policy-changes)
    relaying: object = None
    # the new policies of changes made while an exchange was being judged, resolved or
    # dialed: it is judged again by them before it relays (drive/executor.py)
    recheck: Mapping[str | None, Policy] | None = None
    task: asyncio.Task[None] | None = None
    rec: AccessRecord | None = None  # the exchange whose open record was written, for progress
    # the callback driver's dial in progress (its connect timeout is the sweeper's)
    dialing: Dialer | None = None
    # set by `stop` for a connection no task serves: done when it has ended
    ended: asyncio.Future[None] | None = None

    # -- its transitions: every change of state is one of these, named for what happened
    # (tests/unit/test_design.py: no module but this one assigns a `Conn`'s attributes), so
    # what the sweeper, a policy change and the audit lines read is written in one place

    def head_begins(self, now: float) -> None:
        """Bytes of a next request arrived on a kept-alive connection: the head timeout runs."""
        self.phase, self.phase_since = "head", now

    def serving(self, raw_head: bytes | None = None) -> None:
        """A head was read and is being served (`raw_head`: its bytes, when the caller read
        it): no head timeout, and the exchange writes its own record."""
        if raw_head is not None:
            self.raw_head = raw_head
        self.phase, self.served = "active", True

    def accounted(self) -> None:
        """Its record is written elsewhere (an exchange's or a refusal's): closing it writes
        no connection record of its own (`Steps.record_closed`)."""
        self.served = True

    def exchange_begins(self) -> None:
        """A new exchange starts: the last one's record is not what it opens, nor an
        earlier policy change's recheck its own (docs/policy.md#live-policy-changes)."""
        self.relaying = self.recheck = None

    def handshake_begins(self, now: float) -> None:
        """Waiting for the client's handshake (a ClientHello, a SOCKS5 greeting, a DNS
        query): the sweeper ends the wait after the head timeout (`hello_timeout`)."""
        self.phase, self.phase_since = "hello", now

    def handshake_done(self) -> None:
        """The handshake was read: the exchange goes on."""
        self.phase = "active"

    def dial_started(self, dialer: Dialer) -> None:
        """A dial is under way (its connect timeout is the sweeper's)."""
        self.dialing = dialer

    def dial_over(self) -> Dialer | None:
        """The dial reported (or was given up): the dialer it was, if any."""
        dialer, self.dialing = self.dialing, None
        return dialer

    def connected(self, upstream: Side, rec: AccessRecord) -> None:
        """`rec`'s exchange has its upstream (dialed, or taken from the pool): the sweeper's
        idle timeout and `progress` records watch both (docs/audit-log.md#open-and-progress)."""
        self.upstream, self.rec = upstream, rec

    def upstream_done(self) -> None:
        """The exchange's upstream went back to the pool or was closed."""
        self.upstream = None

    def relays(self, rec: AccessRecord) -> None:
        """`rec`'s exchange relays: a policy change judges it again, in flight and once
        kept alive after it (docs/policy.md#live-policy-changes)."""
        self.relaying = rec

    def request_forwarded(self, raw_head: bytes, rec: AccessRecord) -> None:
        """A kept-alive request (`raw_head`) went upstream from the callback fast path:
        `serving` and `relays` at once, on the one path where a call counts
        (tests/integration/test_calls_per_request.py)."""
        self.phase, self.raw_head, self.relaying = "active", raw_head, rec

    def request_ended(self, now: float) -> None:
        """A request is over and the connection is kept alive: idle until its next head,
        its upstream gone, and no policy change met meanwhile is the next exchange's (a
        change marks only an exchange being judged: `policies_changed`)."""
        self.phase, self.phase_since = "idle", now
        self.upstream = self.recheck = None

    def policies_changed(self, policies: Mapping[str | None, Policy]) -> None:
        """Policies changed while its exchange was judged, resolved or dialed: it is judged
        again by them before it relays (`take_changes`, drive/executor.py)."""
        self.recheck = {**(self.recheck or {}), **policies}

    def take_changes(self) -> Mapping[str | None, Policy] | None:
        """The policy changes met since its exchange began (`policies_changed`), now judged."""
        policies, self.recheck = self.recheck, None
        return policies

    def counted_as(self, owner: object) -> None:
        """Counted against `owner`'s cap (a client id, or a source: admission.py)."""
        self.owner = owner

    def redirected(self, orig_dst: str) -> None:
        """Transparent mode: the client was going to `orig_dst` (ip:port)."""
        self.orig_dst = orig_dst

    def cut_by(self, end: End) -> None:
        """The proxy ended it (a timeout, a policy change, a stop, its listener removed):
        its records end as `end` says, whatever its sides saw of the cut
        (docs/audit-log.md#end-values). The caller closes what it cuts."""
        self.end = end.value

    def run_by(self, task: asyncio.Task[None]) -> None:
        """Its coroutine serves it from now on."""
        self.task = task

    def stop_waits(self, ended: asyncio.Future[None]) -> asyncio.Future[None]:
        """`stop` waits for this connection, which no task serves, to end (`ended`)."""
        self.ended = ended
        return ended


async def read_message(side: Side, parse: Callable[[bytearray], tuple[T, int] | None]) -> T | None:
    """The next message `parse` recognizes in `side`'s buffer; None if the peer ended first.
    A parser error (`SocksError`...) propagates: SOCKS5 handshakes and DNS over TCP."""
    while True:
        if side.buf:
            parsed = parse(side.buf)
            if parsed is not None:
                message, used = parsed
                side.consume(used)
                return message
        if not await side.read_more():
            return None


async def read_head(
    conn: Conn, limits: Limits, loop: asyncio.AbstractEventLoop
) -> wire.RequestHead | None:
    side = conn.side
    searched = 0  # bytes already scanned for the end of the head (no quadratic rescans)
    while True:
        if side.buf:
            if conn.phase == "idle":
                conn.head_begins(loop.time())
            try:
                parsed = wire.parse_request_head(
                    side.buf,
                    max_size=limits.max_head,
                    max_headers=limits.max_headers,
                    searched=searched,
                )
            except ProtocolError:
                _refuse_tls(side.buf)
                raise
            if parsed is not None:
                head, used = parsed
                conn.raw_head = bytes(side.buf[:used])
                side.consume(used)
                return head
            _refuse_tls(side.buf)
            searched = len(side.buf)
        if not await side.read_more():
            if side.buf:
                raise ProtocolError("connection closed inside a request head", 400)
            return None


TLS_TO_PLAIN_PORT = (
    "TLS to a plain-HTTP proxy port: the proxy URL must be http://, not https:// "
    "(HTTPS destinations still get TLS end to end, inside CONNECT)"
)


def _refuse_tls(buf: bytearray) -> None:
    """A TLS handshake record (0x16) can never start a request line: a client was given an
    https:// proxy URL (`curl -x https://...`). Say so (docs/proxy.md#tls-to-the-plain-port)."""
    if buf[:1] == b"\x16":
        raise ProtocolError(TLS_TO_PLAIN_PORT, 400)


def sweep(conn: Conn, now: float, lim: Limits) -> None:
    """Enforce the head, hello, connect and idle timeouts on one connection."""
    dialing = conn.dialing
    if dialing is not None and now - dialing.started > lim.connect_timeout:
        dialing.expire()  # the next address, or the dial's refusal (connection_timeout)
    if conn.phase == "hello" and now - conn.phase_since > lim.head_timeout:
        conn.cut_by(End.HELLO_TIMEOUT)  # inside an open tunnel: nothing to answer
        conn.side.close()
        if conn.upstream is not None:
            conn.upstream.close()
        return
    if conn.phase == "head" and now - conn.phase_since > lim.head_timeout:
        conn.cut_by(End.HEAD_TIMEOUT)
        if conn.side.buf:
            conn.side.write(error_response(HEAD_TIMEOUT.reason, HEAD_TIMEOUT.detail)[1])
        conn.side.close()
        return
    last = conn.side.last_active
    if conn.upstream is not None:
        last = max(last, conn.upstream.last_active)
    if now - last > lim.idle_timeout:
        conn.cut_by(End.IDLE_TIMEOUT)
        conn.side.close()
        if conn.upstream is not None:
            conn.upstream.close()


def idle_of(conns: Iterable[Conn]) -> Conn | None:
    """The longest-idle kept-alive connection (one between requests) among `conns`: at the
    global cap a client's own one makes room for its newcomer (docs/proxy.md#limits)."""
    idle = [c for c in conns if c.phase == "idle" and not c.side.buf and c.end is None]
    return min(idle, key=lambda c: c.phase_since) if idle else None


__all__ = ["Conn", "Limits", "idle_of", "read_head", "read_message", "sweep"]

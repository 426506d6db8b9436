"""One socket of the proxy, and protocol-level relaying between two of them.

Strategy: every socket (client or upstream) is a `Side`, an asyncio Protocol with two modes.

* *Buffered*: incoming bytes accumulate in `buf` for the connection's coroutine, which parses
  heads from it (`read_more` waits for more). Reading pauses once `buf` exceeds `max_buffer`,
  so a client that floods a head or pipelines without end costs bounded memory.
* *Relay*: `start_relay(sink, framer)` sends incoming bytes straight to the other side's
  transport from `data_received`, with no coroutine per chunk. A `framer` (Content-Length
  countdown, chunked scanner, or none for a tunnel) says how many bytes belong to the message;
  bytes past its end go back into `buf` for the next message, and the returned future
  completes when the message (or the tunnel direction) ends.

Flow control: when a sink's transport buffer passes its high-water mark, asyncio calls the
sink's `pause_writing`, which pauses reading on whichever side feeds it; `resume_writing`
resumes it. Memory per tunnel is therefore bounded by the two transports' write-buffer limits
plus one read chunk, whatever the speed of either peer.

Half-close: in a tunnel, EOF from one side becomes `write_eof()` on the other, and the
connection closes only when both directions have ended (the second EOF closes the other side
at once, after what is buffered for it: the same FIN, one system call and callback fewer).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol, cast

from ...errors import ProtocolError

# 256 KiB of queued output per transport before the feeder is paused: large enough to keep a
# loopback link busy (bulk throughput), small enough that 1,024 connections stay well below
# a gigabyte in the worst case.
WRITE_HIGH_WATER = 256 * 1024
WRITE_LOW_WATER = 64 * 1024


class Framer(Protocol):
    """Counts the bytes of one message body as they pass (see `chunked.ChunkedScanner`)."""

    @property
    def done(self) -> bool: ...

    def feed(self, data: bytes) -> int: ...


class LengthFramer:
    """A body of exactly `length` bytes."""

    __slots__ = ("left",)

    def __init__(self, length: int) -> None:
        self.left = length

    @property
    def done(self) -> bool:
        return self.left == 0

    def feed(self, data: bytes) -> int:
        n = min(len(data), self.left)
        self.left -= n
        return n


class RelayEnded(Exception):
    """A relay stopped before its message ended: `reason` says how (eof, lost, protocol);
    `sink`: the side it wrote to was gone, not the side it read from (a response relay
    whose client reset is the client's end, not the upstream's: docs/audit-log.md#end-values)."""

    def __init__(self, reason: str, detail: str = "", *, sink: bool = False) -> None:
        super().__init__(detail or reason)
        self.reason = reason
        self.sink = sink


class Side(asyncio.Protocol):
    """One socket; see the module docstring. Created by a protocol factory."""

    def __init__(self, loop: asyncio.AbstractEventLoop, max_buffer: int = 65536) -> None:
        self.loop = loop
        self.max_buffer = max_buffer
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.eof = False
        self.lost = False
        self.bytes_relayed = 0
        self.last_active = loop.time()
        self.write_paused = False
        self.sink: Side | None = None
        self.feeder: Side | None = None
        self.framer: Framer | None = None
        self.relay_done: asyncio.Future[None] | None = None
        self._waiter: asyncio.Future[None] | None = None
        # called instead of waking a waiter (bytes, EOF or loss in buffered mode): a
        # callback-driven exchange reading a head (`drive/callback.py`, docs/architecture.md)
        self.on_wake: Callable[[], None] | None = None
        self._read_paused_full = False
        self._read_paused_sink = False
        # an upstream: the record of the last exchange it carried; a policy change re-judges
        # it while it waits in the pool (docs/policy.md#live-policy-changes)
        self.last_rec: object = None

    # --- asyncio.Protocol -----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement the interface without subclassing asyncio.Transport
        self.transport = transport = cast(asyncio.Transport, transport)
        # (TCP_NODELAY: both asyncio and uvloop already set it on every TCP transport)
        transport.set_write_buffer_limits(WRITE_HIGH_WATER, WRITE_LOW_WATER)

    def data_received(self, data: bytes) -> None:
        self.last_active = self.loop.time()
        if self.sink is not None:
            self._forward(data)
            return
        self.buf += data
        if len(self.buf) > self.max_buffer and not self._read_paused_full:
            self._read_paused_full = True
            self._pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        if self.sink is not None:
            if self.framer is None:  # tunnel direction: pass the half-close on
                sink = self.sink
                t = sink.transport
                self._finish(None)
                if t is not None and not t.is_closing():
                    if sink.eof and sink.relay_done is None and self.feeder is None:
                        # the other direction ended already: both are over, and a close
                        # (after what is still buffered) says the same FIN without a
                        # separate `shutdown` (bench/profile.md)
                        t.close()
                    elif t.can_write_eof():
                        t.write_eof()
            else:
                self._finish(RelayEnded("eof", "peer closed before the end of the message"))
        self._wake()
        return True  # keep the transport open for writing (half-close)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.eof = True
        if self.sink is not None or self.relay_done is not None:
            self._finish(RelayEnded("lost", str(exc) if exc else "connection closed"))
        if self.feeder is not None:
            self.feeder._unpause_from_sink()
        self._wake()

    def pause_writing(self) -> None:
        self.write_paused = True
        feeder = self.feeder
        if feeder is not None and not feeder._read_paused_sink:
            feeder._read_paused_sink = True
            feeder._pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.feeder is not None:
            self.feeder._unpause_from_sink()

    # --- buffered mode --------------------------------------------------------------------
    async def read_more(self) -> bool:
        """Wait until more bytes arrive in `buf` (True) or the peer ended (False)."""
        if self.eof:
            return False
        self.want_more()
        waiter = self.loop.create_future()
        self._waiter = waiter
        try:
            await waiter
        finally:
            self._waiter = None
        return not self.eof or bool(self.buf)

    def want_more(self) -> None:
        """Read on if reading paused on a full `buf` that `max_buffer` now allows."""
        if self._read_paused_full and len(self.buf) <= self.max_buffer:
            self._read_paused_full = False
            self._resume_reading()

    def consume(self, n: int) -> None:
        """Drop the first `n` bytes of `buf` (a parsed head)."""
        del self.buf[:n]
        if self._read_paused_full and len(self.buf) <= self.max_buffer // 2:
            self._read_paused_full = False
            self._resume_reading()

    def write(self, data: bytes) -> bool:
        """Write if still open; False if the transport is closing."""
        t = self.transport
        if t is None or t.is_closing():
            return False
        t.write(data)
        return True

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # --- relay mode -----------------------------------------------------------------------
    def start_relay(
        self, sink: Side, framer: Framer | None, prefix: bytes = b""
    ) -> asyncio.Future[None]:
        """Relay bytes from this side into `sink` until `framer` is done (or EOF for None).

        `prefix` (a response head) is written first, in the same write as whatever part of
        the message is already buffered, saving a system call per small response.
        """
        fut: asyncio.Future[None] = self.loop.create_future()
        self.relay_done = fut
        self.sink = sink
        self.framer = framer
        sink.feeder = self
        if framer is not None and framer.done:
            sink.write(prefix)
            self._finish(None)
            return fut
        if self.buf:
            data = bytes(self.buf)
            self.buf.clear()
            self._forward(data, prefix)
        elif prefix:
            sink.write(prefix)
        if self.sink is None:
            return fut
        if self._read_paused_full:
            self._read_paused_full = False
            self._resume_reading()
        if sink.write_paused and not self._read_paused_sink:
            self._read_paused_sink = True
            self._pause_reading()
        if self.lost:
            self._finish(RelayEnded("lost", "connection closed"))
        elif self.eof:
            self.eof_received()
        return fut

    def _forward(self, data: bytes, prefix: bytes = b"") -> None:
        sink = self.sink
        assert sink is not None
        framer = self.framer
        if framer is None:
            n = len(data)
        else:
            try:
                n = framer.feed(data)
            except ProtocolError as exc:
                self._finish(RelayEnded("protocol", str(exc)))
                return
        if n or prefix:
            chunk = data if n == len(data) else data[:n]
            if not sink.write(prefix + chunk if prefix else chunk):
                self._finish(RelayEnded("lost", "peer connection closed", sink=True))
                return
            self.bytes_relayed += n
        if framer is not None and framer.done:
            if n < len(data):
                self.buf += data[n:]
                self._wake()
            self._finish(None)

    def _finish(self, exc: BaseException | None) -> None:
        sink = self.sink
        self.sink = None
        self.framer = None
        if sink is not None and sink.feeder is self:
            sink.feeder = None
        self._unpause_from_sink()
        fut = self.relay_done
        self.relay_done = None
        if fut is not None and not fut.done():
            if exc is None:
                fut.set_result(None)
            else:
                fut.set_exception(exc)

    # --- reading control ------------------------------------------------------------------
    def _unpause_from_sink(self) -> None:
        if self._read_paused_sink:
            self._read_paused_sink = False
            self._resume_reading()

    def _pause_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self._read_paused_full or self._read_paused_sink:
            return
        t = self.transport
        if t is not None and not t.is_closing() and not t.is_reading():
            t.resume_reading()

    def _wake(self) -> None:
        cb = self.on_wake
        if cb is not None:
            cb()
            return
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

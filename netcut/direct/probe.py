"""Probe a namespace from inside: do kept ADDR:PORTs accept TCP, do blocked ones refuse?

Runs in netcut's worker after it entered the namespace (worker.run_in_netns). All connects start at
once (non-blocking) and share one deadline, so a probe of any size takes at most `timeout`
seconds: a silently dropped SYN is a timeout, never a hang. A reachable target must complete
the handshake; a blocked one must not (refused, unreachable, reset, or timed out all count).
"""

from __future__ import annotations

import errno
import os
import selectors
import socket
import time

from netcut.plan.model import Keep, ProbeItem, ProbeResult

__all__ = ["DEFAULT_TIMEOUT_S", "ProbeItem", "ProbeResult", "run_probe"]

# Container-to-host on one machine answers in well under a millisecond; a second leaves room
# for a loaded CI machine while keeping a failed fail-closed check short.
DEFAULT_TIMEOUT_S = 1.0


def run_probe(
    reachable: tuple[Keep, ...], blocked: tuple[Keep, ...], timeout: float = DEFAULT_TIMEOUT_S
) -> ProbeResult:
    """Connect to every target at once; classify each by the deadline."""
    targets = [(k, "reachable") for k in reachable] + [(k, "blocked") for k in blocked]
    outcomes: dict[int, str] = {}
    sources: dict[int, str] = {}
    sel = selectors.DefaultSelector()
    socks = []
    try:
        for i, (keep, _) in enumerate(targets):
            sock = socket.socket(socket.AF_INET6 if keep.addr.version == 6 else socket.AF_INET)
            sock.setblocking(False)
            socks.append(sock)
            code = sock.connect_ex((str(keep.addr), keep.port or 0))
            if code in (0, errno.EINPROGRESS):
                sel.register(sock, selectors.EVENT_WRITE, i)
                sources[i] = _source(sock)
            else:
                outcomes[i] = errno.errorcode.get(code, str(code))
        _wait(sel, outcomes, time.monotonic() + timeout)
    finally:
        sel.close()
        for sock in socks:
            sock.close()
    return ProbeResult(
        tuple(
            ProbeItem(str(keep), expect, outcome, sources[i] if outcome == "connected" else "")
            for i, (keep, expect) in enumerate(targets)
            for outcome in (outcomes.get(i, "timeout"),)
        )
    )


def _source(sock: socket.socket) -> str:
    """The probe connection's own ADDR:PORT (bound by `connect`), as the listener sees its
    peer: the proxy tells the probe's connection from an agent's by it, however late it
    accepts it (docs/netcut.md#probe)."""
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _wait(sel: selectors.BaseSelector, outcomes: dict[int, str], deadline: float) -> None:
    while sel.get_map():
        left = deadline - time.monotonic()
        if left <= 0:
            return
        for key, _ in sel.select(left):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            outcomes[key.data] = (
                "connected" if code == 0 else errno.errorcode.get(code, os.strerror(code))
            )
            sel.unregister(sock)

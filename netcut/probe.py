"""Probe a namespace from inside: do kept ADDR:PORTs accept TCP, do blocked ones refuse?

Runs in netcut's worker after it entered the namespace (nsexec.run_in_netns). All connects start at
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
from dataclasses import dataclass

from netcut.model import Keep

# Container-to-host on one machine answers in well under a millisecond; a second leaves room
# for a loaded CI machine while keeping a failed fail-closed check short.
DEFAULT_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class ProbeItem:
    target: str
    expect: str  # "reachable" | "blocked"
    outcome: str  # "connected" | "timeout" | an errno name such as "ECONNREFUSED"

    @property
    def ok(self) -> bool:
        return (self.outcome == "connected") == (self.expect == "reachable")

    def __str__(self) -> str:
        verdict = "ok" if self.ok else "FAIL"
        return f"{verdict} {self.target} expected {self.expect}: {self.outcome}"


@dataclass(frozen=True)
class ProbeResult:
    items: tuple[ProbeItem, ...]

    @property
    def ok(self) -> bool:
        return all(item.ok for item in self.items)

    def reason(self) -> str:
        """One line naming each failure and its likely cause."""
        bad = [item for item in self.items if not item.ok]
        parts = []
        for item in bad:
            hint = ""
            if item.expect == "reachable" and item.outcome == "timeout":
                hint = " (no answer: a host firewall dropping container-to-host traffic?)"
            elif item.expect == "reachable" and item.outcome == "ECONNREFUSED":
                hint = " (nothing listens there, or a firewall rejects it)"
            parts.append(f"{item.target} expected {item.expect}, got {item.outcome}{hint}")
        return "; ".join(parts)

    def lines(self) -> list[str]:
        return [str(item) for item in self.items]


def run_probe(
    reachable: tuple[Keep, ...], blocked: tuple[Keep, ...], timeout: float = DEFAULT_TIMEOUT_S
) -> ProbeResult:
    """Connect to every target at once; classify each by the deadline."""
    targets = [(k, "reachable") for k in reachable] + [(k, "blocked") for k in blocked]
    outcomes: dict[int, str] = {}
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
            else:
                outcomes[i] = errno.errorcode.get(code, str(code))
        _wait(sel, outcomes, time.monotonic() + timeout)
    finally:
        sel.close()
        for sock in socks:
            sock.close()
    return ProbeResult(
        tuple(
            ProbeItem(str(keep), expect, outcomes.get(i, "timeout"))
            for i, (keep, expect) in enumerate(targets)
        )
    )


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

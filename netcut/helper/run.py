"""One helper run for a sandbox that the host process cannot enter: the listeners it needs,
opened inside its namespace and passed back (helper/listeners.py), then the cut with its probe
and status, all in the same container run (docs/netcut.md#listeners-from-the-helper).

Shell. `HelperRun` is held open by its caller (egress's `prepare_execution`) between the two
steps, because the listeners must be served by the caller's event loop before the probe
connects to them; every method blocks (call them off the event loop). The helper exits when
the run is closed: nothing is left running.
"""

from __future__ import annotations

import contextlib
import socket
from typing import Any

from netcut.api import KeepLike, parse_keeps, probe_targets
from netcut.errors import ApplyFailed
from netcut.flow import CutResult
from netcut.helper import image as helperimage
from netcut.helper import mode
from netcut.helper.listeners import FdPass, ListenSpec
from netcut.helper.session import why_failed
from netcut.plan.status import CutStatus
from netcut.plan.transparent import Redirect
from netcut.resolve import TargetRef


class HelperRun:
    """One helper container for one sandbox: `open`, `listen`, `cut_and_status`, `close`."""

    def __init__(self, target: TargetRef, image: str | None = None) -> None:
        self.target = target
        self.image = image
        self._pass: FdPass | None = None
        self._stack = contextlib.ExitStack()
        self._container: Any = None
        self._ex: Any = None

    def open(self) -> HelperRun:
        """Start the helper (the pass directory mounted) and inspect the container."""
        try:
            self._pass = self._stack.enter_context(FdPass())
            session = mode.open_session(self.target, self.image, (self._pass.bind(),))
            self._container, self._ex = self._stack.enter_context(session)
        except BaseException:
            self.close()
            raise
        return self

    @property
    def netns(self) -> str:
        """The namespace file of the container, as a label (never opened here)."""
        return f"/proc/{self._container.pid}/ns/net"

    @property
    def runs(self) -> int:
        """Containers started so far (one, unless the image had to be imported first)."""
        return int(self._ex.runs)

    def listen(self, specs: tuple[ListenSpec, ...]) -> list[socket.socket]:
        """Open `specs` inside the namespace; the sockets, in order (non-blocking). Raises
        ListenRefused (e.g. EADDRINUSE in the sandbox) or ApplyFailed."""
        assert self._pass is not None, "open() first"
        code, out = self._ex.send(self._pass.command(specs, helperimage.PYTHON))
        if code != 0:
            hint = ""
            if code in (126, 127):
                hint = (
                    f"; the helper image has no {helperimage.PYTHON}: use the default image "
                    "(`netcut helper-image build`) or add a Python 3 interpreter there"
                )
            raise ApplyFailed(
                f"listeners from the helper failed (exit {code}): {why_failed(out, code)}{hint}"
            )
        return self._pass.receive(specs)

    def cut_and_status(
        self,
        keep: tuple[KeepLike, ...] = (),
        *,
        expect_reachable: tuple[KeepLike, ...] = (),
        expect_blocked: tuple[KeepLike, ...] = (),
        redirect: Redirect | None = None,
        allow_privileged: bool = False,
        probe_timeout: float = 1.0,
    ) -> tuple[CutResult, CutStatus]:
        """The cut (transparent mode's redirects with `redirect`), its probe (every
        `expect_reachable` must answer, every `expect_blocked` must not), then `status`."""
        from netcut import flow

        keeps = parse_keeps(keep)
        reachable = probe_targets(expect_reachable, "expect_reachable")
        blocked = probe_targets(expect_blocked, "expect_blocked")
        result = mode.cut_in_session(
            self._container,
            self._ex,
            keeps,
            blocked,
            probe=True,
            allow_privileged=allow_privileged,
            dry_run=False,
            probe_timeout=probe_timeout,
            redirect=redirect,
            expect_reachable=reachable,
        )
        return result, flow.status(self._ex, self._container.store())

    def close(self) -> None:
        """End the run: the helper's stdin closes, it exits; the pass directory goes."""
        self._stack.close()

    def __enter__(self) -> HelperRun:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_opened(target: TargetRef, image: str | None = None) -> HelperRun:
    """A `HelperRun` already open; raises what `open` raises."""
    return HelperRun(target, image).open()


__all__ = ["ApplyFailed", "HelperRun", "ListenSpec", "run_opened"]

"""Listeners from the helper, the boundary's side (docs/user-guide.md#helper-mode): a process
that cannot enter the sandbox's namespace (a docker-group user, rootless podman) has netcut's
helper open every listener the sandbox needs inside it and pass the sockets back
(netcut/helper/listeners.py); this process serves them from its own event loop exactly as it
serves the ones it opens itself, and the same helper run then cuts, probes and reports status.

`listen_specs` is pure: which sockets a preparation needs, as (role, spec) pairs. `Supply`
holds the passed sockets until `Sandboxes` adopts them by role. `HelperCut` is the one
helper run, held open across the two steps.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from netcut.helper.listeners import ListenSpec
from netcut.targetref import parse_target

if TYPE_CHECKING:
    from netcut.helper.run import HelperRun

    from .checks import Preparation
    from .execution import Sandbox

LOOPBACK = "127.0.0.1"
# A role names what a socket is for: ("main",), ("forward", host, port), ("transparent",),
# ("dns",) (its TCP socket, then its UDP one), ("socks",).
Role = tuple[object, ...]


def listen_specs(
    ask: Preparation, prior: Sandbox | None, held: Sequence[tuple[str, int]] = ()
) -> list[tuple[Role, ListenSpec]]:
    """The sockets this preparation must open on the sandbox's loopback, those a previous
    prepare opened left out (`prior`; `held`: its transparent/DNS/SOCKS5 listeners as (kind,
    port)). Mirrors `Sandboxes.bind` and `open_extras`: the proxy listener on `proxy_port`;
    one forwarder per framework route on the route's own port, else one the kernel picks;
    transparent mode's listener and its DNS responder (TCP and UDP on one port); SOCKS5."""
    out: list[tuple[Role, ListenSpec]] = []
    reuse_main = prior is not None and prior.main is not None and prior.proxy_port == ask.proxy_port
    if not reuse_main:
        out.append((("main",), ListenSpec("tcp", LOOPBACK, ask.proxy_port)))
    # a forwarder still served (closed ones have no acceptor) is reused, as `_forwarders` does
    have = {k for k, li in (prior.forwarders if prior else {}).items() if li.acceptor is not None}
    for route in ask.routes:
        if (route.host, route.port) not in have:
            role: Role = ("forward", route.host, route.port)
            out.append((role, ListenSpec("tcp", LOOPBACK, route.port, fallback=True)))
    kinds = dict(held)
    if ask.transparent and not ("transparent" in kinds and "dns" in kinds):
        out.append((("transparent",), ListenSpec("tcp", LOOPBACK, ask.transparent_port)))
        out.append((("dns",), ListenSpec("tcp", LOOPBACK, ask.dns_port)))
        out.append((("dns",), ListenSpec("udp", LOOPBACK, 0, same_port=True)))
    if ask.socks_port is not None and kinds.get("socks5") not in (0, ask.socks_port):
        out.append((("socks",), ListenSpec("tcp", LOOPBACK, ask.socks_port)))
    return out


@dataclass(eq=False)
class Supply:
    """Sockets a helper opened in the sandbox's namespace, by role, until adopted; `netns`
    labels the listeners made from them (the container's namespace file, never opened)."""

    netns: str
    sockets: dict[Role, list[socket.socket]] = field(default_factory=dict)

    def add(self, role: Role, sock: socket.socket) -> None:
        self.sockets.setdefault(role, []).append(sock)

    def take(self, role: Role) -> socket.socket | None:
        """The next socket for `role` (None: none was passed for it)."""
        found = self.sockets.get(role)
        return found.pop(0) if found else None

    def close(self) -> None:
        """Close whatever was not adopted (a preparation that failed midway)."""
        for socks in self.sockets.values():
            for sock in socks:
                sock.close()
        self.sockets.clear()


class HelperCut:
    """One helper run for a preparation in helper mode (netcut.helper.run.HelperRun), driven
    from the event loop: every blocking step in a thread."""

    def __init__(self, ask: Preparation) -> None:
        self.ask = ask
        self.run: HelperRun | None = None

    async def __aenter__(self) -> HelperCut:
        from netcut.helper.run import HelperRun

        run = HelperRun(parse_target(self.ask.sandbox), self.ask.helper_image)
        self.run = await asyncio.to_thread(run.open)
        return self

    async def __aexit__(self, *exc: object) -> None:
        run, self.run = self.run, None
        if run is not None:
            await asyncio.to_thread(run.close)

    async def supply(self, prior: Sandbox | None, held: Sequence[tuple[str, int]]) -> Supply:
        """The sockets this preparation needs, opened by the helper in the namespace."""
        assert self.run is not None
        wanted = listen_specs(self.ask, prior, held)
        out = Supply(self.run.netns)
        if not wanted:
            return out
        specs = tuple(spec for _, spec in wanted)
        socks = await asyncio.to_thread(self.run.listen, specs)
        for (role, _), sock in zip(wanted, socks, strict=True):
            out.add(role, sock)
        return out

    async def cut_and_status(
        self,
        reachable: Sequence[str],
        blocked: Sequence[str],
        redirect: tuple[int, int] | None,
    ) -> tuple[Any, Any, Any]:
        """Cut keeping nothing but loopback, probe (`reachable`: the listeners, which must
        answer from inside; `blocked`), then status: (cut, probe, status)."""
        from netcut.plan.transparent import Redirect

        assert self.run is not None
        cut, status = await asyncio.to_thread(
            self.run.cut_and_status,
            (),
            expect_reachable=tuple(reachable),
            expect_blocked=tuple(blocked),
            redirect=Redirect(*redirect) if redirect is not None else None,
            allow_privileged=self.ask.allow_privileged,
        )
        return cut, cut.probe, status


async def listen_in_sandbox(
    sandbox: str, specs: Sequence[ListenSpec], image: str | None = None
) -> list[socket.socket]:
    """Sockets opened inside a container's namespace by one helper run that cuts nothing
    (a framework's own in-sandbox listener, e.g. verifiers' callback listener, for a
    process that cannot enter the namespace: docs/integrations.md#verifiers)."""
    from netcut.helper.run import HelperRun

    def opened() -> list[socket.socket]:
        with HelperRun(parse_target(sandbox), image) as run:
            return run.listen(tuple(specs))

    return await asyncio.to_thread(opened)

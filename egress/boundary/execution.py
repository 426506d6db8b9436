"""What `prepare_execution` hands the agent (`Execution`), what the proxy holds for each
prepared sandbox (`Sandbox`: the registry's and the helper's shared type, so neither imports
the other), the boundary's errors, modes and ports, and how the agent's environment and
framework URLs are spelled (docs/user-guide.md#sandbox-lifecycle)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from netcut.targetref import default_client_id, parse_target

from ..errors import EgressError
from ..policy.rules import FrameworkRoute
from ..policy.target import join_host_port
from ..proxy.server import Listener

Mode = Literal["loopback", "gateway"]
CutMode = Literal["direct", "helper"]  # netcut's `--mode` (docs/netcut.md#helper-mode)
CUT_MODES = ("direct", "helper")
# What `prepare_execution` takes: "auto" chooses by privileges (netcut.modes)
CutModeChoice = Literal["auto", "direct", "helper"]
CUT_MODE_CHOICES = ("auto", "direct", "helper")
# Each set upper and lower case: which case and which scheme's name a client reads differs
# (curl: `http_proxy` only; aiohttp: `WSS_PROXY` for wss://). docs/clients.md#the-agents-environment
PROXY_ENV = ("HTTP_PROXY", "HTTPS_PROXY", "WS_PROXY", "WSS_PROXY", "ALL_PROXY")
# Node >= 22.21 / 24.5: built-in fetch and http(s).request read the variables only with it
NODE_ENV = {"NODE_USE_ENV_PROXY": "1"}
# Transparent mode's in-namespace ports (on the sandbox's own 127.0.0.1)
TRANSPARENT_PORT = 15001
DNS_PORT = 15053


NotReadyKind = Literal[
    "port_in_use",
    "privileged_process",
    "unsafe_target",
    "not_found",
    "no_privilege",
    "cut_failed",
    "probe_failed",
    "not_cut",
    "namespace",
    "client_id_taken",
    "already_prepared",
    "no_gateway",
    "other",
]


class ExecutionNotReady(EgressError):
    """The boundary could not be proven (cut, probe or listener failed): do not run the agent.

    `kind` says which step failed, so a framework can branch without parsing the message
    (docs/user-guide.md#why-prepare-failed): `port_in_use` (a listener's port is taken inside
    the sandbox), `privileged_process` (a process there could undo the cut), `unsafe_target`
    (the host's or our own namespace), `not_found`, `no_privilege`, `cut_failed` (rolled
    back), `probe_failed`, `not_cut` (status after the cut), `namespace` (cannot enter it),
    `client_id_taken`, `already_prepared` (in another mode, or a gateway sandbox asked for new
    routes), `no_gateway`, `other`."""

    def __init__(self, message: str, kind: NotReadyKind = "other") -> None:
        super().__init__(message)
        self.kind: NotReadyKind = kind

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (str(self), self.kind))


def not_ready_kind(exc: BaseException) -> NotReadyKind:
    """The `ExecutionNotReady.kind` of a failure inside `prepare_execution`."""
    import errno

    from netcut import errors as ne

    from ..proxy.net.netns import NamespaceError

    if isinstance(exc, ExecutionNotReady):
        return exc.kind
    if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
        return "port_in_use"
    if isinstance(exc, NamespaceError):
        return "namespace"
    if isinstance(exc, ne.UnsafeTarget):
        return "privileged_process" if exc.findings else "unsafe_target"
    if isinstance(exc, ne.ProbeFailed):
        return "probe_failed"
    if isinstance(exc, ne.TargetNotFound):
        return "not_found"
    if isinstance(exc, ne.PrivilegeError):
        return "no_privilege"
    if isinstance(exc, ne.ApplyFailed):
        return "cut_failed"
    return "other"


class ReleaseFailed(EgressError):
    """`release_execution(restore=True)` could not undo the cut (the cause is chained)."""


@dataclass(frozen=True)
class Execution:
    """What the agent needs: its environment and the framework URLs as it must use them."""

    sandbox: str
    client_id: str
    proxy_url: str
    env: Mapping[str, str]
    framework_urls: Mapping[str, str]
    token: str
    cut: Any = None  # netcut.CutResult
    probe: Any = None  # netcut.ProbeResult
    listeners: tuple[Listener, ...] = field(default=(), repr=False)
    cut_mode: CutMode = "direct"  # how it was cut, and how `release_execution` restores it
    helper_image: str | None = field(default=None, repr=False)
    # why that cut mode: asked for, or chosen by privileges (netcut.modes)
    cut_mode_reason: str = ""


@dataclass(eq=False)
class Sandbox:
    """What the proxy holds for one prepared sandbox (docs/user-guide.md#sandbox-lifecycle)."""

    key: str
    client_id: str
    mode: Mode
    token: str
    proxy_port: int
    main: Listener | None
    forwarders: dict[tuple[str, int], Listener]


def client_id_of(sandbox: str) -> str:
    """The default client id: the namespace's name, `pid-N`, `RUNTIME-ID`, or for any other
    namespace file `netns-INODE` (netcut.targetref.default_client_id), never `net` for
    every /proc/N/ns/net."""
    ref = parse_target(sandbox)
    inode = None
    if ref.kind == "path":
        with contextlib.suppress(OSError):
            inode = os.stat(ref.value).st_ino
    return default_client_id(ref, inode)


def agent_env(proxy_url: str, no_proxy: Sequence[str]) -> dict[str, str]:
    """The proxy variables every common client reads (PROXY_ENV and NO_PROXY, upper and
    lower case, and Node's switch), so no client needs configuring by hand: which client
    reads which is docs/clients.md#the-agents-environment."""
    env: dict[str, str] = {}
    for name in PROXY_ENV:
        env[name] = env[name.lower()] = proxy_url
    joined = ",".join(dict.fromkeys(no_proxy))
    env["NO_PROXY"] = env["no_proxy"] = joined
    env.update(NODE_ENV)
    return env


def route_url(route: FrameworkRoute, host: str, port: int) -> str:
    """`route`'s URL with its authority replaced by `host:port` (path and scheme kept)."""
    scheme, rest = route.text.split("://", 1)
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    return f"{scheme}://{join_host_port(host, port)}{rest[cut:]}"

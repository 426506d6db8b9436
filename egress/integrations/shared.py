"""`shared_proxy()`: one `EgressProxy` per event loop, for framework integrations.

Framework factories build sandboxes and environments with no arguments (a registry entry
point, a runtime class named in a config file), so an integration cannot be handed a proxy:
it asks for the loop's one. Lifecycle (docs/integrations.md#the-shared-proxy):

- `configure_shared_proxy(...)` says what the next shared proxy is built with (policy or
  settings, audit log path, pinned names, any other `EgressProxy` argument). Without it:
  a deny-all proxy (every sandbox brings its own policy), auditing to `$EGRESS_AUDIT` if set,
  with the pins of `$EGRESS_RESOLVE` (`NAME=ADDR`, comma or space separated) if set.
- The first `await shared_proxy()` on a loop builds and starts it (concurrent first calls
  share one start); later calls on that loop return it. It opens no listener of its own:
  every sandbox gets its own on its loopback from `prepare_execution`.
- It stops, and its audit log is closed (flushed), on `await close_shared_proxy()`, or when
  the loop is shut down by `asyncio.run` (or anything that runs
  `loop.shutdown_asyncgens()`, as anyio and inspect-ai do): a frame waiting in an
  asynchronous generator holds it. A loop closed without that leaves the audit log's last
  lines unwritten, so close it yourself there.

One audit log file belongs to one loop at a time: two loops writing one file would
interleave two hash chains (`egress audit verify` reports it).
"""

from __future__ import annotations

import asyncio
import os
import weakref
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..audit.log import AuditLog
from ..config import Settings, build_settings, load_policy_file, parse_resolve, resolve_pins
from ..errors import PolicyError
from ..policy.addrs import PRIVATE_NETWORKS
from ..policy.rules import Policy
from ..policy.target import IPAddress, IPNetwork
from ..proxy.server import EgressProxy


@dataclass(frozen=True)
class _Config:
    policy: Policy | Settings | None = None
    audit: str | None = None
    resolve: Mapping[str, str | Iterable[str]] | None = None
    proxy_args: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class _Shared:
    proxy: EgressProxy
    audit: AuditLog | None
    keeper: AsyncIterator[None]


_config = _Config()
_by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[_Shared]] = (
    weakref.WeakKeyDictionary()
)


def configure_shared_proxy(
    policy: Policy | Settings | None = None,
    *,
    audit: str | None = None,
    resolve: Mapping[str, str | Iterable[str]] | None = None,
    **proxy_args: Any,
) -> None:
    """What the next shared proxy is built with; a running one keeps what it has.

    `policy` is the proxy's own (every sandbox brings its own; default deny-all); `audit` a
    path for its `AuditLog` (default `$EGRESS_AUDIT`, else no audit log); `resolve` as
    `EgressProxy(resolve=...)`; anything else is passed to `EgressProxy` as is."""
    global _config
    if policy is not None and not isinstance(policy, Policy | Settings):
        raise TypeError(f"configure_shared_proxy policy must be a Policy or Settings: {policy!r}")
    if audit is not None and not isinstance(audit, str):
        raise TypeError(f"configure_shared_proxy audit must be a path, not {audit!r}")
    if resolve is not None:
        resolve_pins(resolve)  # checked now, not when a loop first asks for the proxy
    _config = _Config(policy, audit, resolve, dict(proxy_args))


async def shared_proxy() -> EgressProxy:
    """The running loop's shared proxy, started on first use (see the module docstring)."""
    loop = asyncio.get_running_loop()
    task = _by_loop.get(loop)
    if task is not None and task.done() and not task.cancelled() and task.exception() is None:
        if task.result().proxy.closing:
            task = None
    elif task is not None and task.done():
        task = None  # a failed start is tried again
    if task is None:
        task = _by_loop[loop] = loop.create_task(_start(_config), name="egress-shared-proxy")
    return (await asyncio.shield(task)).proxy


async def close_shared_proxy() -> None:
    """Stop the running loop's shared proxy and close its audit log, if it has one."""
    loop = asyncio.get_running_loop()
    task = _by_loop.pop(loop, None)
    if task is None:
        return
    shared = await task
    await shared.keeper.aclose()  # type: ignore[attr-defined]


def env_pins() -> dict[str, list[str]] | None:
    """`$EGRESS_RESOLVE`: `NAME=ADDR` pins separated by commas or spaces, for a framework
    started from its own CLI (`harbor trials start`, `vf-eval`, `inspect eval`), where no
    code of the user's calls `configure_shared_proxy`."""
    text = os.environ.get("EGRESS_RESOLVE", "")
    entries = text.replace(",", " ").split()
    if not entries:
        return None
    pins = parse_resolve(entries, "EGRESS_RESOLVE")
    return {name: [str(a) for a in addrs] for name, addrs in pins.items()}


async def _start(config: _Config) -> _Shared:
    path = config.audit if config.audit is not None else os.environ.get("EGRESS_AUDIT") or None
    resolve = config.resolve if config.resolve is not None else env_pins()
    log = AuditLog(path) if path else None
    if log is not None:
        await log.start()
    proxy = EgressProxy(
        config.policy or Policy(),
        **{"listen": (), "audit": log, "resolve": resolve, **config.proxy_args},
    )
    try:
        await proxy.start()
    except BaseException:
        await proxy.stop()
        if log is not None:
            await log.aclose()
        raise
    keeper = _keep(proxy, log)
    await keeper.__anext__()  # registered with the loop's asynchronous generator hooks
    return _Shared(proxy, log, keeper)


async def _keep(proxy: EgressProxy, log: AuditLog | None) -> AsyncIterator[None]:
    """Suspended for the proxy's whole life; closing it (explicitly, or by the loop's
    `shutdown_asyncgens`) stops the proxy and flushes the audit log."""
    try:
        yield
    finally:
        await proxy.stop()
        if log is not None:
            await log.aclose()


@dataclass(frozen=True)
class EvaluatorFile:
    """An evaluator policy file (harbor's `egress_policy`, inspect's `policy_file`), every
    key of it: the evaluator `policy` (composed over the task's), and what it sets for the
    whole proxy: `pins` (its `resolve` table) and reserved networks (`reserve`,
    `reserve_private`). `[clients]` and `mode = "report"` are refused by `load_evaluator`
    (docs/integrations.md#the-evaluator-file)."""

    policy: Policy
    pins: Mapping[str, tuple[IPAddress, ...]] = field(default_factory=dict)
    reserve: tuple[IPNetwork, ...] = ()

    def apply_to(self, proxy: EgressProxy) -> None:
        """Add the file's pins and reserved networks to the (shared) proxy. They are the
        proxy's, seen by every sandbox it serves: a name another environment pinned to
        other addresses is a `PolicyError`, never a silent second answer."""
        pins = proxy.resolver.pins
        for name, addrs in self.pins.items():
            have = pins.get(name)
            if have is not None and set(have) != set(addrs):
                shown = ", ".join(map(str, have))
                raise PolicyError(
                    f"resolve {name!r}: the shared proxy already pins it to "
                    f"{shown} (EGRESS_RESOLVE, configure_shared_proxy or another environment)"
                )
        pins.update(self.pins)
        for net in self.reserve:
            proxy.reserve(str(net))


def load_evaluator(path: object, option: str = "egress_policy") -> EvaluatorFile | None:
    """The evaluator file at `path` honoured in full, or a `PolicyError` naming `option` and
    the key that cannot be (a per-sandbox environment is one client; compose keeps no
    report mode)."""
    if path is None:
        return None
    where = f"{option} {str(path)!r}"
    data = load_policy_file(str(path))
    if "clients" in data:
        raise PolicyError(
            f"{where}: [clients] tables are not supported for one sandbox (the sandbox "
            "is the one client: put its rules at the top level)"
        )
    if data.get("mode", "enforce") != "enforce":
        raise PolicyError(
            f"{where}: mode = {data['mode']!r} is not supported for one sandbox (the "
            "phase policy is enforced; use `egress check` to try a policy out)"
        )
    settings = build_settings(data, where=where)
    reserve = settings.guard.extra + (PRIVATE_NETWORKS if settings.guard.reserve_private else ())
    return EvaluatorFile(settings.policy, dict(settings.resolve), tuple(reserve))

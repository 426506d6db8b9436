"""SIGHUP in `egress serve`: the policy file read again and swapped in, or kept on any error
(docs/proxy.md#sighup).

Strategy: the file is read and validated off the event loop with the same command-line
options it was started with; reloads are serialized, so the file read last is the one
applied; the one stderr line says which policy (and which clients' policies) changed.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from .config import settings_from_args
from .printable import printable
from .proxy.server import EgressProxy


async def reload_policy(
    proxy: EgressProxy, args: argparse.Namespace, serial: asyncio.Lock | None = None
) -> None:
    """SIGHUP: re-read the policy file (with the same command-line options), validate it and
    swap it in; on any error keep the policy in force and say why (docs/proxy.md#sighup).

    Reloads hold `serial` from reading the file to applying it, and asyncio's lock wakes
    waiters in order: two SIGHUPs 50 ms apart apply in signal order, so the file read last
    wins (a slow parse of the older file can no longer land after the newer one)."""
    async with serial or asyncio.Lock():
        await _reload(proxy, args)


async def _reload(proxy: EgressProxy, args: argparse.Namespace) -> None:
    from .errors import EgressError

    old = proxy.settings.policy.digest
    before = {c.client_id: c.policy.digest for c in proxy.settings.clients}
    try:
        settings = await asyncio.to_thread(settings_from_args, args)
    except (EgressError, OSError, ValueError) as exc:
        print(
            f"egress serve: policy reload failed, keeping policy {old}: {printable(str(exc))}",
            file=sys.stderr,
            flush=True,
        )
        return
    await proxy.replace_settings(settings, source="sighup")
    print(
        f"egress serve: policy reloaded: {old} -> {settings.policy.digest}"
        + reload_clients(before, {c.client_id: c.policy.digest for c in settings.clients}),
        file=sys.stderr,
        flush=True,
    )


def reload_clients(before: dict[str, str], after: dict[str, str]) -> str:
    """Each client's policy hash before and after a reload (`-` for none), so the message
    says which sandboxes' policies changed; client ids escaped (docs/proxy.md#sighup)."""
    if not before and not after:
        return ""
    parts = [
        f"{printable(cid)} {before.get(cid, '-')} -> {after.get(cid, '-')}"
        for cid in sorted(set(before) | set(after))
    ]
    return "; clients: " + ", ".join(parts)


__all__ = ["reload_clients", "reload_policy"]

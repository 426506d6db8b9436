"""The framework's process as a docker-group user (run by test_unprivileged_engines.py under
a real non-root uid): an EgressProxy, `prepare_execution` on a container with the default
`cut_mode="auto"`, then, when told on stdin, `release_execution(restore=True)` ("release") or
`release_execution(forget=True)` ("forget"); stdin closed: it ends without releasing (the
cut and its record stay, as when a framework dies). One JSON line on stdout per step; the test
drives the agent in the container meanwhile.

argv: SANDBOX PINS_JSON PREPARE_KWARGS_JSON [AUDIT_PATH]
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time

from trialprobe import identity


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


async def main(sandbox: str, pins: list[str], kwargs: dict[str, object], audit: str | None) -> None:
    from egress import (
        AuditLog,
        EgressProxy,
        Policy,
        build_settings,
        prepare_execution,
        release_execution,
    )

    with open("/proc/self/status") as f:
        caps = next(line.split()[1] for line in f if line.startswith("CapEff:"))
    policy = Policy(allow=["pypi.test"], block=["evil.test"])
    settings = build_settings({}, resolve=pins)
    async with contextlib.AsyncExitStack() as stack:
        log = await stack.enter_async_context(AuditLog(audit)) if audit else None
        proxy = await stack.enter_async_context(
            EgressProxy(settings, listen=["127.0.0.1:0"], audit=log)
        )
        t0 = time.perf_counter()
        try:
            execution = await prepare_execution(sandbox, policy, proxy, **kwargs)  # type: ignore[arg-type]
        except Exception as exc:
            say(step="prepare", error=f"{type(exc).__name__}: {exc}", caps=caps)
            return
        prepare_s = time.perf_counter() - t0
        say(
            step="prepare",
            seconds=prepare_s,
            caps=caps,
            cut_mode=execution.cut_mode,
            reason=execution.cut_mode_reason,
            proxy_url=execution.proxy_url,
            listeners=[[li.kind, li.host, li.port] for li in execution.listeners],
            probe=[[i.target, i.expect, i.outcome] for i in execution.probe.items],
            **identity(),
        )
        loop = asyncio.get_running_loop()
        line = (await loop.run_in_executor(None, sys.stdin.readline)).strip()
        if not line:
            return
        assert line in ("release", "forget"), line
        t0 = time.perf_counter()
        how = {"restore": True} if line == "release" else {"forget": True}
        summary = await release_execution(proxy, execution, **how)
        say(
            step="release",
            seconds=time.perf_counter() - t0,
            allowed=dict(summary.by_host.get("pypi.test", {})),
            blocked=sorted(summary.blocked_hosts),
        )


if __name__ == "__main__":
    audit = sys.argv[4] if len(sys.argv) > 4 else None
    asyncio.run(main(sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), audit))

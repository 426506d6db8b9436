"""The end-to-end demo (`./dev.sh demo`): setup online, the cut, the agent behind the proxy.

It builds a small world of network namespaces on this machine — a *sandbox* standing in for
an agent's container and an *upstream* standing in for the internet — using only addresses
in 198.18.128.0/17 (the benchmarking range; nothing leaves this machine), then tells the
story step by step and removes everything again, also on Ctrl-C. Without root it explains
what it needs and runs the part that needs no privilege (`egress check` over the embedded
example policy).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import resources

from aiohttp import web

from .audit.log import AuditLog
from .boundary import Execution, prepare_execution, release_execution
from .config import build_settings, load_policy_file
from .policy.rules import Policy
from .proxy.net.netns import listen_in_netns
from .proxy.server import EgressProxy

# Capabilities dropped and an unprivileged user: what a well-run agent process looks like.
AGENT = [
    "setpriv",
    "--reuid=65534",
    "--regid=65534",
    "--clear-groups",
    "--inh-caps=-all",
    "--bounding-set=-all",
    "--",
]
SAFETY_NET = "198.18.0.0/15"


def say(text: str = "", *, step: str | None = None) -> None:
    if step:
        print(f"\n== {step}", flush=True)
    if text:
        print(f"   {text}", flush=True)


def show(label: str, rc: int, out: str, err: str) -> None:
    first = (out.strip().splitlines() or err.strip().splitlines() or [""])[0]
    print(f"   - {label}\n       -> {first[:120]}", flush=True)


def example_policy_path() -> str:
    return str(resources.files("egress") / "examples" / "policy.toml")


# --- the world ----------------------------------------------------------------------------


def ip(*args: str, check: bool = True) -> None:
    subprocess.run(["ip", *args], check=check, capture_output=True, timeout=30)


@dataclass
class World:
    """sandbox <-> upstream directly (setup traffic), and each with a veth to this host."""

    tag: str
    sandbox: str
    upstream: str
    net: int  # third octet of 198.18.<net>.0/24 owned by this demo

    def addr(self, last: int) -> str:
        return f"198.18.{self.net}.{last}"

    @property
    def upstream_addr(self) -> str:  # the proxy reaches the upstream here
        return self.addr(6)

    @property
    def upstream_direct(self) -> str:  # the sandbox reaches the upstream here (setup)
        return self.addr(10)

    def build(self) -> None:
        for ns in (self.sandbox, self.upstream):
            ip("netns", "add", ns)
            ip("-n", ns, "link", "set", "lo", "up")
        self._veth(f"eds{self.tag}", self.sandbox, self.addr(1), self.addr(2))
        self._veth(f"edu{self.tag}", self.upstream, self.addr(5), self.addr(6))
        a, b = f"edx{self.tag}", f"edy{self.tag}"
        ip(
            "link",
            "add",
            a,
            "netns",
            self.sandbox,
            "type",
            "veth",
            "peer",
            "name",
            b,
            "netns",
            self.upstream,
        )
        ip("-n", self.sandbox, "addr", "add", f"{self.addr(9)}/30", "dev", a)
        ip("-n", self.upstream, "addr", "add", f"{self.addr(10)}/30", "dev", b)
        ip("-n", self.sandbox, "link", "set", a, "up")
        ip("-n", self.upstream, "link", "set", b, "up")
        ip("-n", self.sandbox, "route", "add", "default", "via", self.addr(1))

    def _veth(self, name: str, ns: str, host_addr: str, ns_addr: str) -> None:
        ip("link", "add", f"{name}h", "type", "veth", "peer", "name", f"{name}n")
        ip("link", "set", f"{name}n", "netns", ns)
        ip("addr", "add", f"{host_addr}/30", "dev", f"{name}h")
        ip("link", "set", f"{name}h", "up")
        ip("-n", ns, "addr", "add", f"{ns_addr}/30", "dev", f"{name}n")
        ip("-n", ns, "link", "set", f"{name}n", "up")

    def remove(self) -> None:
        for name in (f"eds{self.tag}h", f"edu{self.tag}h"):
            ip("link", "del", name, check=False)
        for ns in (self.sandbox, self.upstream):
            ip("netns", "del", ns, check=False)


@contextlib.contextmanager
def world() -> Iterator[World]:
    pid = os.getpid()
    w = World(f"{pid % 100000}", f"egdemo-sandbox-{pid}", f"egdemo-upstream-{pid}", 128 + pid % 120)
    added = (
        subprocess.run(
            ["ip", "route", "add", "prohibit", SAFETY_NET], capture_output=True
        ).returncode
        == 0
    )
    try:
        w.build()
        yield w
    finally:
        w.remove()
        if added:
            ip("route", "del", "prohibit", SAFETY_NET, check=False)


async def run(*argv: str) -> tuple[int, str, str]:
    """Run a command off the loop's thread (the proxy keeps serving); 20 s at most."""
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        async with asyncio.timeout(20):
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return 124, "", "timed out"
    return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")


async def in_sandbox(w: World, env: dict[str, str], *argv: str) -> tuple[int, str, str]:
    envargs = [f"{k}={v}" for k, v in env.items()]
    return await run(
        "ip", "netns", "exec", w.sandbox, "env", "-i", "PATH=/usr/bin:/bin", *envargs, *AGENT, *argv
    )


async def start_app(name: str, sock_or_host: object, port: int = 0) -> web.AppRunner:
    async def answer(request: web.Request) -> web.Response:
        return web.json_response({"server": name, "path": request.path})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    if isinstance(sock_or_host, str):
        await web.TCPSite(runner, sock_or_host, port).start()
    else:
        await web.SockSite(runner, sock_or_host).start()  # type: ignore[arg-type]
    return runner


# --- the story ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Attempt:
    """One thing the agent tries from inside the cut sandbox, and what must come of it."""

    label: str  # what `show` prints
    curl: tuple[str, ...]  # curl's arguments after `-sS`
    works: bool | None  # curl's exit: True 0, False not 0, None either (the body decides)
    says: tuple[str, ...]  # one of these must be in the body
    otherwise: str  # the line printed when it does not come out as expected

    def met(self, rc: int, out: str) -> bool:
        if self.works is not None and (rc == 0) != self.works:
            return False
        return not self.says or any(word in out for word in self.says)


def attempts(w: World, model_url: str) -> list[Attempt]:
    """What the agent tries, in order: the story's third act as data."""
    return [
        Attempt(
            "allowed: http://pypi.demo/ through the proxy (expected: works)",
            ("--max-time", "5", "http://pypi.demo/simple/requests/"),
            True,
            (),
            "the allowed request failed",
        ),
        Attempt(
            "blocked: http://evil.pythonhosted.demo/ - a block rule beats the wildcard "
            "(expected: 403 with the rule)",
            ("--max-time", "5", "http://evil.pythonhosted.demo/payload"),
            None,
            ("403",),
            "the blocked request was not refused",
        ),
        Attempt(
            "direct: around the proxy, to the upstream's address (expected: fails)",
            ("--noproxy", "*", "--max-time", "3", f"http://{w.upstream_direct}/exfiltrate"),
            False,
            (),
            "a direct connection got through",
        ),
        Attempt(
            "loopback trick: http://2130706433:22/, 127.0.0.1 as a number (expected: 403)",
            ("--noproxy", "", "--max-time", "5", "http://2130706433:22/"),
            None,
            ("403",),
            "the loopback trick was not refused",
        ),
        Attempt(
            "loopback trick: an allowed name whose DNS answer is 127.0.0.1 (expected: 403)",
            ("--max-time", "5", "http://files.pythonhosted.demo/"),
            None,
            ("destination_ip_prohibited", "reserved"),
            "the name resolving to loopback was not refused by the address guard",
        ),
        Attempt(
            f"framework route: the model API at {model_url} (expected: works)",
            ("--max-time", "5", model_url + "/chat"),
            True,
            (),
            "the framework route was not reachable",
        ),
    ]


async def story(w: World, audit_path: str) -> int:
    failures = 0

    def expect(ok: bool, what: str) -> None:
        nonlocal failures
        if not ok:
            failures += 1
            print(f"   !! unexpected: {what}", flush=True)

    data = load_policy_file(example_policy_path())
    resolve = [f"{h}={w.upstream_addr}" for h in ("pypi.demo", "evil.pythonhosted.demo")]
    # an allowed name whose DNS answer points at loopback: the address guard's job
    resolve.append("files.pythonhosted.demo=127.0.0.1")
    upstream_app = await start_app("upstream", listen_in_netns(w.upstream, "0.0.0.0", 80))
    # the framework's model API on this host's loopback (any free port; the example policy's
    # 8089 may be taken on a busy machine)
    model_app = await start_app("model-api", "127.0.0.1", 0)
    route = f"http://127.0.0.1:{model_app.addresses[0][1]}/v1"
    settings = build_settings({**data, "framework_routes": [route]}, resolve=resolve)
    try:
        say(
            "The sandbox (an agent's container) and the upstream (the internet) exist.",
            step="1. Setup, online",
        )
        rc, out, err = await in_sandbox(
            w, {}, "curl", "-sS", "--max-time", "5", f"http://{w.upstream_direct}/simple/requests/"
        )
        show("setup fetches a package straight from the upstream (expected: works)", rc, out, err)
        expect(rc == 0, "setup could not reach the upstream")
        async with (
            AuditLog(audit_path) as audit,
            EgressProxy(settings, listen=["127.0.0.1:0"], audit=audit) as proxy,
        ):
            execution = await cut(w, settings.policy, proxy, route)
            env = dict(execution.env)
            say("The agent runs as nobody with no capabilities.", step="3. The agent")
            for attempt in attempts(w, execution.framework_urls[route]):
                rc, out, err = await in_sandbox(w, env, "curl", "-sS", *attempt.curl)
                show(attempt.label, rc, out, err)
                expect(attempt.met(rc, out), attempt.otherwise)
            await release_execution(proxy, execution, restore=True)
    finally:
        await upstream_app.cleanup()
        await model_app.cleanup()
    return failures


async def cut(w: World, policy: Policy, proxy: EgressProxy, route: str) -> Execution:
    """The story's second act: the sandbox is cut, and the agent's environment shown."""
    say(
        "The proxy runs inside this process. Now cut the sandbox: only its loopback "
        "stays, where the proxy listens.",
        step="2. The cut",
    )
    execution = await prepare_execution(
        w.sandbox,
        policy,
        proxy,
        framework_routes=[route],
        expect_blocked=[f"{w.upstream_direct}:80", f"{w.addr(1)}:53"],
    )
    say(f"cut in {execution.cut.elapsed_ms:.1f} ms; probe: {execution.probe.reason() or 'ok'}")
    say(
        f"agent env: HTTPS_PROXY=http://{execution.client_id}:***@127.0.0.1:"
        f"{execution.proxy_url.rsplit(':', 1)[1]}  NO_PROXY={execution.env['NO_PROXY']}"
    )
    return execution


def summarize(audit_path: str) -> int:
    from .audit.cli import audit_main

    say("What a security reviewer sees (egress audit summarize):", step="4. The audit")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = audit_main(["summarize", audit_path])
        verify = audit_main(["verify", audit_path])
    for line in buf.getvalue().splitlines():
        print(f"   {line}")
    return rc or verify


def unprivileged() -> int:
    say(
        "The full demo creates network namespaces, so it needs root (or CAP_NET_ADMIN and "
        "CAP_SYS_ADMIN). Run `sudo ./dev.sh demo`. Meanwhile, the part that needs no "
        "privilege: judging targets against the embedded example policy.",
        step="Not root",
    )
    from .cli import main as egress_main

    args = [
        "check",
        "--policy",
        example_policy_path(),
        "--lint",
        "https://pypi.demo",
        "http://evil.pythonhosted.demo/",
        "files.pythonhosted.demo",
        "http://2130706433/",
        "example.com:22",
    ]
    print("   $ egress " + " ".join(args), flush=True)
    rc = egress_main(args)
    return 0 if rc in (0, 1) else rc


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m egress.demo",
        description="The end-to-end demo (`./dev.sh demo` sets up, then runs this): two "
        "network namespaces on this machine (a sandbox "
        "and an upstream, addresses in 198.18.128.0/17 only), the cut, an agent behind the "
        "proxy, and the audit log. Needs root; without it, runs `egress check` on the "
        "example policy. Removes everything it created, also on Ctrl-C.",
    )
    p.add_argument(
        "--audit-log",
        metavar="PATH",
        help="keep the demo's audit log at PATH (default: a temporary file, removed at the end)",
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    print("egress-netcut demo: an agent's network, cut down to exactly what it is allowed.")
    if os.geteuid() != 0:
        return unprivileged()
    with tempfile.TemporaryDirectory(prefix="egress-demo-") as tmp:
        audit_path = args.audit_log or os.path.join(tmp, "audit.jsonl")
        try:
            with world() as w:
                failures = asyncio.run(story(w, audit_path))
        except KeyboardInterrupt:
            print("\ninterrupted: everything the demo created has been removed")
            return 130
        rc = summarize(audit_path)
    if failures or rc:
        print(f"\ndemo FAILED ({failures} unexpected outcomes)")
        return 1
    kept = f" The audit log is kept at {args.audit_log}." if args.audit_log else ""
    say(f"Everything the demo created is gone.{kept} Details: README.md and docs/.", step="Done")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

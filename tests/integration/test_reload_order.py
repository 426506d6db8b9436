"""Policy changes take effect everywhere (issue 19 item 5, docs/proxy.md#sighup).

- Two SIGHUPs 50 ms apart: before, each reload parsed in its own thread and applied when it
  finished, so a slow parse of the older, permissive file landed after the newer one and
  stayed in force. Reloads are serialized now: the file read last wins.
- Reload messages name each client's policy hash before and after.
- `replace_settings()` (what SIGHUP uses) dropped the transparent fake-IP pool from the guard,
  so under default-allow a fake IP was dialed; pools the proxy reserved survive now.
"""

from __future__ import annotations

import asyncio
import ipaddress
import signal
import sys
from pathlib import Path

from egress import EgressProxy, Limits
from egress.config import build_settings, load_policy_file
from egress.proxy.codec.dns import DEFAULT_FAKE_NETWORK

from proxykit import raw_exchange


async def _reload_line(stream: asyncio.StreamReader) -> str:
    while True:
        line = (await asyncio.wait_for(stream.readline(), 60)).decode()
        assert line, "serve exited"
        if "policy reload" in line:
            return line


def _applied(line: str) -> str:
    """The top-level policy a `policy reloaded: OLD -> NEW; clients: ...` line applied."""
    return line.split("; clients:")[0].rsplit("-> ", 1)[1].strip()


def _digest(path: Path) -> str:
    return build_settings(load_policy_file(str(path))).policy.digest


async def test_two_sighups_apply_in_order_and_name_client_hashes(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    strict = 'allow = []\n[clients.sb]\ntoken = "t"\nallow = ["a.test"]\n'
    policy.write_text(strict)
    start = _digest(policy)
    # a permissive file that takes long to parse (many rules), then a strict one
    rules = ", ".join(f'"h{i}.test"' for i in range(40000))
    permissive = (
        f'default = "allow"\nallow = [{rules}]\n[clients.sb]\ntoken = "t"\ndefault = "allow"\n'
    )
    (tmp_path / "permissive.toml").write_text(permissive)
    (tmp_path / "strict.toml").write_text(strict.replace("a.test", "b.test"))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "egress.cli", "serve", "--listen", "127.0.0.1:0",
        "--policy", str(policy), "--quiet",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    assert proc.stderr is not None
    try:
        await asyncio.wait_for(proc.stdout.readline(), 20)  # listening
        policy.write_text(permissive)
        proc.send_signal(signal.SIGHUP)
        await asyncio.sleep(0.05)  # the repro's 50 ms between the two signals
        policy.write_text((tmp_path / "strict.toml").read_text())
        proc.send_signal(signal.SIGHUP)
        first, second = await _reload_line(proc.stderr), await _reload_line(proc.stderr)
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 20)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    last = _digest(tmp_path / "strict.toml")
    middle = _digest(tmp_path / "permissive.toml")
    # the first reload read the permissive file (or, on a slow machine, already the strict
    # one); either way the second applied the file read last, never the older one
    assert f"{start} -> {middle}" in first or f"{start} -> {last}" in first, (first, second)
    assert _applied(second) == last, (first, second)  # the file read last is in force
    assert "; clients: sb sha256:" in first
    assert "; clients: sb sha256:" in second


async def test_the_fake_ip_pool_survives_replace_settings() -> None:
    settings = build_settings({"default": "allow"})
    limits = Limits(connect_timeout=2.0)
    async with EgressProxy(settings, limits=limits) as proxy:
        proxy.reserve(DEFAULT_FAKE_NETWORK)  # what a transparent sandbox's DNS listener does
        await proxy.replace_settings(build_settings({"default": "allow"}), source="sighup")
        host, port = proxy.addresses[0]
        reply = await raw_exchange(host, port, b"CONNECT 198.19.128.7:443 HTTP/1.1\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 403"), reply[:200]
    assert proxy.guard.classify(ipaddress.ip_address("198.19.128.7")) == "reserved_extra"

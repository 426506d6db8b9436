"""`egress serve` as a process, the threaded runner, and listening inside a namespace."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path

import pytest

from egress import AuditLog, EgressProxy, Policy, ProxyThread

import harness
from proxykit import exempt
from servers import echo, run, start_origin, start_tcp


async def start_serve(*args: str) -> tuple[asyncio.subprocess.Process, list[str]]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "egress.cli",
        "serve",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    lines = []
    listens = sum(1 for a in args if a == "--listen")
    for _ in range(listens):
        line = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode().strip()
        lines.append(line)
    return proc, lines


def audit_lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.mark.userns
async def test_serve_with_curl_and_sigterm_leaves_complete_audit(
    test_host: harness.TestHost, tmp_path: Path
) -> None:
    origin = await start_origin(test_host, 80)
    echo_srv = await start_tcp(test_host, 7000, echo)
    log = tmp_path / "audit.jsonl"
    proc, lines = await start_serve(
        "--listen",
        "127.0.0.1:0",
        "--listen",
        "127.0.0.1:0",
        "--allow",
        "example.test",
        "--allow",
        "example.test:7000",
        "--resolve",
        f"example.test={test_host.addr_ns}",
        "--audit-log",
        str(log),
    )
    try:
        assert len(lines) == 2
        assert all(line.startswith("listening on 127.0.0.1:") for line in lines)
        url = "http://" + lines[1].removeprefix("listening on ")
        rc, out, err = await run(
            "curl", "-sS", "--max-time", "5", "-x", url, "http://example.test/hi"
        )
        assert rc == 0, err
        assert json.loads(out)["host"] == "example.test"
        rc, out, _ = await run(
            "curl", "-sS", "-i", "--max-time", "5", "-x", url, "http://other.test/"
        )
        assert " 403 " in out.splitlines()[0]
        # an open tunnel at SIGTERM time is closed within the grace period and logged
        host, port = lines[0].removeprefix("listening on ").rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"CONNECT example.test:7000 HTTP/1.1\r\n\r\nping")
        await writer.drain()
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        assert await reader.readexactly(4) == b"ping"
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 15) == 0
        writer.close()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        echo_srv.close()
        await origin.close()
    records = audit_lines(log)
    assert records[0]["type"] == "start"
    assert records[-1]["type"] == "end"
    requests = [r for r in records if r.get("type") is None or r.get("type") == "request"]
    assert [(r["method"], r["decision"]) for r in requests] == [
        ("GET", "allow"),
        ("GET", "block"),
        ("CONNECT", "allow"),
    ]
    tunnel = requests[2]
    assert tunnel["bytes_up"] == 4
    assert tunnel["bytes_down"] == 4
    for r in requests:
        for key in (
            "ts",
            "client",
            "method",
            "scheme",
            "host",
            "port",
            "decision",
            "reason",
            "rule",
        ):
            assert key in r
    rc, out, err = await run(sys.executable, "-m", "egress.cli", "audit", "verify", str(log))
    assert rc == 0, out + err


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--listen", "nope"], "--listen"),
        (["--allow", "a[b]"], "'['"),
        (["--listen", "127.0.0.1:0", "--max-connections", "0"], "max-connections"),
        (["--listen", "127.0.0.1:0", "--audit-log", "/nonexistent/dir/a.jsonl"], "audit log"),
    ],
)
async def test_serve_bad_input_exits_2(args: list[str], needle: str) -> None:
    rc, _, err = await run(sys.executable, "-m", "egress.cli", "serve", *args)
    assert rc == 2
    assert needle in err
    assert "Traceback" not in err


async def test_proxy_thread_for_sync_callers() -> None:
    origin = await start_origin(None, 0)
    settings = exempt(Policy(allow=[origin.authority]), origin.port)
    try:

        def sync_part() -> str:
            with ProxyThread(lambda: EgressProxy(settings)) as proxy:
                import subprocess

                return subprocess.run(
                    [
                        "curl",
                        "-sS",
                        "--max-time",
                        "5",
                        "-x",
                        proxy.url,
                        f"http://{origin.authority}/sync",
                    ],
                    capture_output=True,
                    text=True,
                    timeout=10,
                ).stdout

        # the origin is served by this loop, so the synchronous caller runs in a thread
        out = await asyncio.to_thread(sync_part)
        assert json.loads(out)["path"] == "/sync"
    finally:
        await origin.close()


@pytest.mark.netns
async def test_listen_inside_sandbox_namespace(test_host_factory: object, tmp_path: Path) -> None:
    sandbox = test_host_factory()  # type: ignore[operator]
    upstream = test_host_factory()  # type: ignore[operator]
    origin = await start_origin(upstream, 80)
    log = tmp_path / "a.jsonl"
    try:
        async with (
            AuditLog(str(log)) as audit,
            EgressProxy(
                Policy(allow=[upstream.addr_ns]),
                listen=["127.0.0.1:3128"],
                listen_netns=sandbox.ns,
                audit=audit,
            ) as proxy,
        ):
            assert proxy.url == "http://127.0.0.1:3128"
            # the sandbox reaches the proxy on its own loopback; the host has no such port
            rc, out, err = await run(
                "ip",
                "netns",
                "exec",
                sandbox.ns,
                "curl",
                "-sS",
                "--max-time",
                "5",
                "-x",
                proxy.url,
                f"http://{upstream.addr_ns}/from-sandbox",
            )
            assert rc == 0, err
            assert json.loads(out)["path"] == "/from-sandbox"
            # from the host, 127.0.0.1:3128 is not this proxy: whatever answers there (on a
            # shared machine another suite's proxy may), the request never reaches ours
            await run(
                "curl",
                "-sS",
                "--max-time",
                "2",
                "-x",
                proxy.url,
                f"http://{upstream.addr_ns}/from-host",
            )
        records = audit_lines(log)
        assert any(r.get("path") == "/from-sandbox" for r in records)
        assert not any(r.get("path") == "/from-host" for r in records)
        assert records[-1]["type"] == "end"
    finally:
        await origin.close()


async def test_serve_workers_share_the_port_and_keep_one_chain_each(tmp_path: Path) -> None:
    """`--workers 2`: one `listening on` line per listener, requests from real curl spread
    over both workers (SO_REUSEPORT), one audit chain per worker that `audit verify` reads
    together, and SIGTERM to the parent stops every worker gracefully.

    The origin listens on a loopback port, reached as a framework route (`egress serve`'s one
    way through the guard to loopback): no root needed, and the chains are the same.
    """
    origin = await start_origin(None, 0)
    site = f"http://{origin.authority}"
    log = tmp_path / "audit.jsonl"
    proc, lines = await start_serve(
        "--workers",
        "2",
        "--listen",
        "127.0.0.1:0",
        "--listen",
        "127.0.0.1:0",
        "--framework-route",
        site,
        "--audit-log",
        str(log),
    )
    try:
        assert len(lines) == 2
        assert all(line.startswith("listening on 127.0.0.1:") for line in lines)
        urls = ["http://" + line.removeprefix("listening on ") for line in lines]
        assert urls[0] != urls[1]
        codes = []
        for i in range(40):  # a new connection each: the kernel picks a worker per connection
            rc, out, err = await run(
                "curl",
                "-sS",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "--max-time",
                "5",
                "-x",
                urls[i % 2],
                f"{site}/{i}",
            )
            assert rc == 0, err
            codes.append(out)
        assert codes == ["200"] * 40
        rc, out, _ = await run("curl", "-sS", "-i", "-x", urls[0], "http://other.test/")
        assert " 403 " in out.splitlines()[0]
        children = await _children(proc.pid)
        assert len(children) == 2
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == 0
        for pid in children:
            assert (
                not Path(f"/proc/{pid}").exists()
                or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
            )
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await origin.close()
    assert not log.exists()
    per_worker = [tmp_path / "audit.w0.jsonl", tmp_path / "audit.w1.jsonl"]
    paths = [str(p) for p in per_worker]
    requests = []
    for path in per_worker:
        records = audit_lines(path)
        assert records[0]["type"] == "start"
        assert records[-1]["type"] == "end"
        mine = [r for r in records if r.get("type") in (None, "request")]
        assert mine, f"{path.name} served nothing: the port was not shared"
        requests += mine
    assert sorted(r["path"] for r in requests if r["decision"] == "allow") == sorted(
        f"/{i}" for i in range(40)
    )
    assert [r["host"] for r in requests if r["decision"] == "block"] == ["other.test"]
    # the chains are read together, given by their files or by the configured name
    for given in (paths, [str(log)]):
        rc, out, err = await run(sys.executable, "-m", "egress.cli", "audit", "verify", *given)
        assert rc == 0, out + err
        assert "41 request records" in out
    rc, out, err = await run(
        sys.executable, "-m", "egress.cli", "audit", "summarize", "--json", str(log)
    )
    assert rc == 0, err
    assert json.loads(out)["totals"]["events"] == 41
    # and one edited line in one worker's chain is found
    text = per_worker[1].read_text().replace('"/', '"/x', 1)
    per_worker[1].write_text(text)
    rc, out, _ = await run(sys.executable, "-m", "egress.cli", "audit", "verify", str(log))
    assert rc == 1
    assert "audit.w1.jsonl" in out


async def _children(pid: int) -> list[int]:
    _, out, _ = await run("pgrep", "-P", str(pid))
    return [int(x) for x in out.split()]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--workers", "0"], "--workers"),
        (["--workers", "2", "--audit-log", "-"], "audit-log"),
        (["--workers", "2", "--listen-netns", "x"], "listen-netns"),
    ],
)
async def test_serve_workers_bad_input_exits_2(args: list[str], needle: str) -> None:
    rc, _, err = await run(sys.executable, "-m", "egress.cli", "serve", "--quiet", *args)
    assert rc == 2
    assert needle in err
    assert "Traceback" not in err


async def test_serve_workers_exit_when_the_parent_is_killed() -> None:
    """No orphan keeps serving the port after the parent died without stopping it."""
    proc, lines = await start_serve("--quiet", "--workers", "2", "--listen", "127.0.0.1:0")
    try:
        assert lines[0].startswith("listening on 127.0.0.1:")
        children = await _children(proc.pid)
        assert len(children) == 2
        proc.kill()
        await proc.wait()
        deadline = asyncio.get_running_loop().time() + 10
        while any(_running(pid) for pid in children):
            assert asyncio.get_running_loop().time() < deadline, "a worker outlived its parent"
            await asyncio.sleep(0.05)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"

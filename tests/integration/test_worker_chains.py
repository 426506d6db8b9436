"""Workers in the chain (issue 19 item 8, docs/audit-log.md#several-workers).

Repro: under `--workers 2`, deleting `audit.w1.jsonl` (a whole worker's requests) left
`egress audit verify` saying OK, exit 0; renaming w1 to w0 passed too, and the start records
carried no worker index or count. Now each start record names its worker and the count, and
verify fails when a worker's file is missing or renamed.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import sys
from pathlib import Path

from servers import run


async def serve_workers(tmp_path: Path, *extra: str) -> asyncio.subprocess.Process:
    """`egress serve --workers 2` with an audit log; returns once it listens."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "egress.cli", "serve", "--workers", "2",
        "--listen", "127.0.0.1:0", "--audit-log", str(tmp_path / "audit.jsonl"), *extra,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
    assert line.startswith("listening on"), line
    return proc


async def stop(proc: asyncio.subprocess.Process) -> int:
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return await asyncio.wait_for(proc.wait(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def verify(*paths: Path) -> tuple[int, str]:
    rc, out, err = await run(
        sys.executable, "-m", "egress.cli", "audit", "verify", *map(str, paths)
    )
    return rc, out + err


async def test_verify_fails_when_a_workers_file_is_missing_or_renamed(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    proc = await serve_workers(run_dir)
    assert await stop(proc) == 0
    w0, w1 = run_dir / "audit.w0.jsonl", run_dir / "audit.w1.jsonl"
    for index, path in enumerate((w0, w1)):
        start = json.loads(path.read_text().splitlines()[0])
        assert (start["type"], start["worker"], start["workers"]) == ("start", index, 2)
    rc, out = await verify(run_dir / "audit.jsonl")
    assert rc == 0, out

    missing = tmp_path / "missing"
    shutil.copytree(run_dir, missing)
    (missing / "audit.w1.jsonl").unlink()
    rc, out = await verify(missing / "audit.jsonl")
    assert rc == 1, out
    assert "no file of worker 1" in out

    renamed = tmp_path / "renamed"
    shutil.copytree(run_dir, renamed)
    (renamed / "audit.w0.jsonl").unlink()
    (renamed / "audit.w1.jsonl").rename(renamed / "audit.w0.jsonl")
    rc, out = await verify(renamed / "audit.jsonl")
    assert rc == 1, out
    assert "start record of worker 1 of 2 in the file of worker 0" in out


async def test_sighup_to_workers_is_a_rolling_reload(tmp_path: Path) -> None:
    """Repro: with `--workers 2`, SIGHUP killed the whole set (rc 129) though the docs said
    the parent ignores it. Now each worker reloads the policy file and the set keeps serving."""
    policy = tmp_path / "policy.toml"
    policy.write_text('allow = ["a.test"]\n')
    proc = await serve_workers(tmp_path, "--policy", str(policy))
    assert proc.stderr is not None
    try:
        policy.write_text('allow = ["b.test"]\n')
        proc.send_signal(signal.SIGHUP)
        reloaded = []
        while len(reloaded) < 2:
            line = (await asyncio.wait_for(proc.stderr.readline(), 30)).decode()
            assert line, f"serve exited (rc {await proc.wait()}) instead of reloading"
            if "policy reloaded" in line:
                reloaded.append(line)
        assert proc.returncode is None
    finally:
        rc = await stop(proc)
    assert rc == 0
    for index in (0, 1):
        records = [
            json.loads(x) for x in (tmp_path / f"audit.w{index}.jsonl").read_text().splitlines()
        ]
        applied = [r for r in records if r.get("type") == "policy" and r["client_id"] is None]
        assert [r["source"] for r in applied] == ["start", "sighup"]
        assert applied[1]["canonical"]["allow"] == ["b.test"]


async def test_each_worker_line_is_one_write_under_unbuffered_stdio(tmp_path: Path) -> None:
    """Repro: with PYTHONUNBUFFERED (as CI sets it) `print` wrote the text and its newline
    separately, so two workers reloading at once ran into one stderr line and a reader saw
    one `policy reloaded` line (the rolling-reload test timed out ~25 % of runs under load).
    stderr here is a SOCK_SEQPACKET socket, which keeps each write a separate message: every
    reload line must arrive whole, newline included, in one write."""
    policy = tmp_path / "policy.toml"
    policy.write_text('allow = ["a.test"]\n')
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "egress.cli", "serve", "--workers", "2",
        "--listen", "127.0.0.1:0", "--audit-log", str(tmp_path / "audit.jsonl"),
        "--policy", str(policy),
        stdout=asyncio.subprocess.PIPE, stderr=theirs,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    theirs.close()
    assert proc.stdout is not None
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        assert line.startswith("listening on"), line
        policy.write_text('allow = ["b.test"]\n')
        proc.send_signal(signal.SIGHUP)
        loop = asyncio.get_running_loop()
        ours.setblocking(False)
        writes: list[str] = []
        while sum("policy reloaded" in w for w in writes) < 2:
            message = await asyncio.wait_for(loop.sock_recv(ours, 65536), 30)
            assert message, f"serve closed stderr; writes so far: {writes}"
            writes.append(message.decode())
        reloads = [w for w in writes if "policy reloaded" in w]
        assert all(w.startswith("egress serve: policy reloaded") for w in reloads), writes
        assert all(w.endswith("\n") and w.count("\n") == 1 for w in reloads), writes
    finally:
        assert await stop(proc) == 0
        ours.close()

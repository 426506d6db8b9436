"""AuditLog, the writer the proxy calls: records, chain, rotation, hooks, failure modes."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import os
import re
import shutil
import time
from pathlib import Path

import pytest

from egress.audit.format import GENESIS, line_hash
from egress.audit.log import AuditLog
from egress.audit.verify import ChainVerifier
from egress.audit.writer import BATCH_LINES, LogWriter

EVENT: dict[str, object] = {
    "client": "198.18.0.2:41000",
    "method": "CONNECT",
    "scheme": "https",
    "host": "pypi.org",
    "port": 443,
    "decision": "allow",
    "reason": "allow_rule",
    "rule": "pypi.org",
}
TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def read_records(path: Path) -> list[dict[str, object]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as stream:
        return [json.loads(line) for line in stream]


def verify(*paths: Path, live: bool = False) -> list[str]:
    verifier = ChainVerifier(live=live)
    for path in paths:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as stream:
            for number, raw in enumerate(stream, 1):
                verifier.feed(
                    f"{path.name}:{number}", raw.rstrip(b"\n"), complete=raw.endswith(b"\n")
                )
    return [str(p) for p in verifier.finish().problems]


async def wait_for(condition: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def test_run_has_start_requests_and_end(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    async with AuditLog(str(path)) as log:
        for _ in range(3):
            log.record(EVENT)
    records = read_records(path)
    assert [r.get("type") for r in records] == ["start", None, None, None, "end"]
    start, end = records[0], records[-1]
    assert start["run"] == end["run"] == log.run_id
    assert start["prev"] == GENESIS
    assert start["seq"] == 0
    assert end["lines"] == end["seq"] == 4
    assert end["requests"] == 3
    assert [r["seq"] for r in records] == [0, 1, 2, 3, 4]
    assert log.lines_written == 5
    assert log.write_errors == 0
    assert verify(path) == []
    assert log.head == line_hash(path.read_bytes().splitlines()[-1])


async def test_record_adds_ts_and_keeps_a_given_one(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    async with AuditLog(str(path)) as log:
        log.record(EVENT)
        log.record({**EVENT, "ts": "2026-01-02T03:04:05.006Z"})
    first, second = read_records(path)[1:3]
    assert isinstance(first["ts"], str)
    assert TS.match(first["ts"])
    assert second["ts"] == "2026-01-02T03:04:05.006Z"
    assert list(first)[:2] == ["ts", "client"]  # ts first, then the event's own order
    assert list(first)[-2:] == ["seq", "prev"]


async def test_lines_are_compact_ascii_json(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    async with AuditLog(str(path)) as log:
        log.record({**EVENT, "detail": 'bücher \u2028 "quoted"\nnewline'})
    raw = path.read_bytes().splitlines()[1]
    assert raw.isascii()
    assert b", " not in raw
    assert json.loads(raw)["detail"] == 'bücher \u2028 "quoted"\nnewline'


async def test_odd_values_never_raise(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    async with AuditLog(str(path)) as log:
        log.record({**EVENT, "addr": Path("/x"), "duration_ms": float("nan")})
        log.record({**EVENT, "bytes_up": 2**70, "nested": {"a": [1, (2, 3)]}})
    odd, nested = read_records(path)[1:3]
    assert odd["addr"] == "/x"
    assert odd["duration_ms"] is None
    assert nested["nested"] == {"a": [1, [2, 3]]}
    assert verify(path) == []


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        ({"path": "/a/b?token=s3cret&x=1"}, {"path": "/a/b?REDACTED"}),
        ({"path": "/plain"}, {"path": "/plain"}),
        ({"url": "http://user:pw@h.example/p?q=1"}, {"url": "http://h.example/p?REDACTED"}),
        ({"Proxy-Authorization": "Basic eDp5"}, {}),
        ({"authorization": "Bearer x", "cookie": "a=b", "Set-Cookie": "c"}, {}),
        ({"token": "t", "client_token": "t", "api_key": "k", "password": "p"}, {}),
        ({"seq": 99, "prev": "forged"}, {}),
        ({"body": "secret data", "request_body": "x", "Payload": "y"}, {}),
    ],
    ids=[
        "query",
        "no-query",
        "url-userinfo",
        "proxy-authorization",
        "auth-cookie",
        "token-like",
        "chain-fields",
        "bodies",
    ],
)
async def test_redaction(
    tmp_path: Path, event: dict[str, object], expected: dict[str, object]
) -> None:
    path = tmp_path / "audit.jsonl"
    seen: list[dict[str, object]] = []
    async with AuditLog(str(path)) as log:
        log.add_hook(seen.append)
        log.record({**EVENT, **event})
    written = read_records(path)[1]
    for record in (written, seen[0]):
        extra = {
            k: v for k, v in record.items() if k not in EVENT and k not in ("ts", "seq", "prev")
        }
        assert extra == expected
    assert written["seq"] == 1
    raw = path.read_text()
    for secret in ("s3cret", "eDp5", "Bearer", "pw@", "forged", "secret data"):
        assert secret not in raw


async def test_keep_query(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    async with AuditLog(str(path), keep_query=True) as log:
        log.record({**EVENT, "path": "/a?x=1", "cookie": "still dropped"})
    record = read_records(path)[1]
    assert record["path"] == "/a?x=1"
    assert "cookie" not in record


async def test_record_does_not_mutate_the_callers_dict(tmp_path: Path) -> None:
    event = {**EVENT, "path": "/a?b", "cookie": "c"}
    async with AuditLog(str(tmp_path / "audit.jsonl")) as log:
        log.record(event)
    assert event == {**EVENT, "path": "/a?b", "cookie": "c"}


async def test_appending_a_second_run_links_to_the_first(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    for _ in range(2):
        async with AuditLog(str(path)) as log:
            log.record(EVENT)
    lines = path.read_bytes().splitlines()
    second_start = json.loads(lines[3])
    assert second_start["type"] == "start"
    assert second_start["prev"] == line_hash(lines[2])
    assert verify(path) == []


async def test_a_crashed_runs_half_line_is_ended_not_glued(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    async with AuditLog(str(path)) as log:
        log.record(EVENT)
    with path.open("ab") as stream:
        stream.write(b'{"ts":"2026-')  # a crash in the middle of a line
    async with AuditLog(str(path)) as log:
        log.record(EVENT)
    lines = path.read_bytes().splitlines()
    assert lines[3] == b'{"ts":"2026-'
    assert json.loads(lines[4])["type"] == "start"
    problems = verify(path)
    assert len(problems) == 1
    assert "audit.jsonl:4" in problems[0]


async def test_rotation_keeps_the_chain_across_files(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    async with AuditLog(str(path), rotate_bytes=2000) as log:
        for index in range(60):
            log.record({**EVENT, "port": index})
            if index % 7 == 0:
                await log.flush()
    rotated = sorted(tmp_path.glob("audit.jsonl.*.gz"), key=lambda p: -int(p.name.split(".")[2]))
    assert len(rotated) >= 3
    files = [*rotated, path]
    for file in files:
        assert file.stat().st_size <= 2000
        assert file.stat().st_mode & 0o777 == 0o600  # audit logs are not world-readable
    assert verify(*files) == []
    records = [r for file in files for r in read_records(file)]
    assert [r["seq"] for r in records] == list(range(len(records)))
    assert [r["port"] for r in records if r.get("type") is None] == list(range(60))
    for file in files[1:]:
        assert read_records(file)[0]["type"] == "rotate"
    # A missing middle file is a gap; the files out of order is a broken chain.
    assert any("missing" in p for p in verify(*files[:1], *files[2:]))
    assert verify(files[1], files[0], *files[2:]) != []


async def test_stdout(capfd: pytest.CaptureFixture[str]) -> None:
    async with AuditLog("-") as log:
        log.record(EVENT)
    lines = capfd.readouterr().out.splitlines()
    assert [json.loads(line).get("type") for line in lines] == ["start", None, "end"]


async def test_no_file_still_feeds_hooks_and_events() -> None:
    log = AuditLog(None)
    seen: list[dict[str, object]] = []
    async_seen: list[dict[str, object]] = []

    async def async_hook(event: dict[str, object]) -> None:
        await asyncio.sleep(0)
        async_seen.append(event)

    log.add_hook(seen.append)
    log.add_hook(async_hook)
    async with log:
        stream = log.events()
        log.record(EVENT)
        log.record({**EVENT, "host": "b.example"})
        first = await anext(stream)
        second = await anext(stream)
    assert [e["host"] for e in (first, second)] == ["pypi.org", "b.example"]
    assert [e["host"] for e in seen] == ["pypi.org", "b.example"]
    assert [e["host"] for e in async_seen] == ["pypi.org", "b.example"]
    assert log.lines_written == 0
    assert [e async for e in stream] == []  # ends at aclose()


async def test_events_drops_oldest_for_a_slow_consumer(tmp_path: Path) -> None:
    async with AuditLog(None, events_maxlen=3) as log:
        stream = log.events()
        for port in range(10):
            log.record({**EVENT, "port": port})
        assert log.events_dropped == 7
        got = [(await anext(stream))["port"] for _ in range(3)]
    assert got == [7, 8, 9]


async def test_failing_hooks_are_counted_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    def bad(event: dict[str, object]) -> None:
        raise RuntimeError("boom")

    async def bad_async(event: dict[str, object]) -> None:
        raise RuntimeError("async boom")

    with caplog.at_level(logging.ERROR, logger="egress.audit"):
        async with AuditLog(None) as log:
            log.add_hook(bad)
            log.add_hook(bad_async)
            log.record(EVENT)
        # aclose() (leaving the block) waits for the async hook's task: no sleep needed
    assert log.hook_errors == 2
    assert "audit hook failed" in caplog.text


async def test_record_after_close_is_counted(tmp_path: Path) -> None:
    log = AuditLog(str(tmp_path / "audit.jsonl"))
    async with log:
        pass
    log.record(EVENT)
    assert log.lines_dropped == 1


async def test_never_started_and_started_twice(tmp_path: Path) -> None:
    log = AuditLog(str(tmp_path / "audit.jsonl"))
    log.record(EVENT)
    await log.aclose()
    assert log.lines_dropped == 1  # counted, not silently gone
    assert [e async for e in log.events()] == []  # a closed log's events() ends at once
    async with AuditLog(None) as again:
        with pytest.raises(RuntimeError, match="twice"):
            await again.start()


async def test_start_raises_when_the_file_cannot_be_opened(tmp_path: Path) -> None:
    log = AuditLog(str(tmp_path / "missing-dir" / "audit.jsonl"))
    with pytest.raises(OSError, match="No such file"):
        await log.start()


def test_bad_options() -> None:
    with pytest.raises(ValueError, match="fail_mode"):
        AuditLog(None, fail_mode="maybe")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rotate_bytes"):
        AuditLog(None, rotate_bytes=0)
    # before: keep=0 was accepted and removed every rotated file at each rotation
    with pytest.raises(ValueError, match="keep must be at least 1"):
        AuditLog(None, keep=0)


# ---- an unwritable log: /dev/full, a removed directory -------------------------------------


@pytest.mark.parametrize("fail_mode", ["open", "closed"])
async def test_dev_full_is_reported_counted_and_follows_fail_mode(
    fail_mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    with caplog.at_level(logging.ERROR, logger="egress.audit"):
        log = AuditLog(
            "/dev/full",
            fail_mode=fail_mode,  # type: ignore[arg-type]
            retry_interval=0.05,
            close_timeout=0.2,
        )
        await log.start()
        log.record(EVENT)
        await log.flush()
        assert log.write_errors >= 1
        assert not log.writable
        assert log.accepting is (fail_mode == "open")
        log.record(EVENT)  # still never raises or blocks
        await log.aclose()
    assert "cannot write audit log /dev/full" in caplog.text
    assert ("refusing new connections" if fail_mode == "closed" else "still serving") in caplog.text
    assert log.lines_written == 0
    assert log.lines_dropped == 5  # start, outage, 2 requests, end: none could be written


@pytest.mark.parametrize("fail_mode", ["open", "closed"])
async def test_removed_directory_then_recovery(
    tmp_path: Path, fail_mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "logs"
    directory.mkdir()
    path = directory / "audit.jsonl"
    with caplog.at_level(logging.WARNING, logger="egress.audit"):
        async with AuditLog(
            str(path),
            fail_mode=fail_mode,  # type: ignore[arg-type]
            retry_interval=0.02,
        ) as log:
            log.record(EVENT)
            await log.flush()
            assert log.accepting
            shutil.rmtree(directory)
            log.record({**EVENT, "host": "during.example"})
            await log.flush()
            assert log.write_errors >= 1
            assert log.accepting is (fail_mode == "open")
            directory.mkdir()  # the operator fixes it; the writer retries by itself
            await wait_for(lambda: log.writable)
            assert log.accepting
            log.record({**EVENT, "host": "after.example"})
    assert "removed or replaced" in caplog.text
    assert "writable again" in caplog.text
    records = read_records(path)
    kinds = [r.get("type") or r.get("host") for r in records]
    # the new file names where it continues (reopen), then nothing queued was lost, and the
    # outage is marked where it began and where it ended (docs/audit-log.md)
    assert kinds == ["reopen", "during.example", "outage", "recovered", "after.example", "end"]
    assert records[3]["write_errors"] >= 1
    assert log.lines_dropped == 0
    # it verifies alone: the reopen record links to the removed file's last line
    assert verify(path) == []


async def test_closed_mode_notices_a_removed_directory_while_idle(tmp_path: Path) -> None:
    directory = tmp_path / "logs"
    directory.mkdir()
    async with AuditLog(
        str(directory / "audit.jsonl"), fail_mode="closed", retry_interval=0.02
    ) as log:
        await log.flush()
        shutil.rmtree(directory)
        await wait_for(lambda: not log.accepting)
        directory.mkdir()
        await wait_for(lambda: log.accepting)


async def test_a_crashed_writer_thread_fails_closed_and_loudly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(self: LogWriter, body: str) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(LogWriter, "_line", broken)
    with caplog.at_level(logging.CRITICAL, logger="egress.audit"):
        async with AuditLog(str(tmp_path / "audit.jsonl"), fail_mode="closed") as log:
            log.record(EVENT)
            await log.flush()  # released even though the thread died
            assert not log.accepting
            log.record(EVENT)
    assert "audit writer thread crashed" in caplog.text
    assert log.lines_dropped == 2  # the one that hit the bug, and the one after


async def test_backlog_overflow_loses_lines_visibly(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    log = AuditLog(str(path), max_backlog=5)
    for port in range(8):  # before start(): nothing drains the queue yet
        log.record({**EVENT, "port": port})
    async with log:
        pass
    records = read_records(path)
    assert [r.get("port") for r in records if r.get("type") is None] == [0, 1, 2, 3, 4]
    loss = [r for r in records if r.get("type") == "loss"]
    assert loss[0]["lost"] == 3
    assert log.lines_dropped == 3
    problems = verify(path)
    assert len(problems) == 1
    assert "3 line(s) missing" in problems[0]


async def test_hot_path_cost(tmp_path: Path) -> None:
    """record() stays cheap: a loose bound here (shared CI machines); the docs give numbers."""
    log = AuditLog(str(tmp_path / "audit.jsonl"))
    event = {
        **EVENT,
        "addr": "198.18.7.10",
        "status": 200,
        "bytes_up": 2210,
        "bytes_down": 181000,
        "duration_ms": 840.5,
        "client_id": "task-7",
    }
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(2000):
            log.record(event)
        best = min(best, (time.perf_counter() - started) / 2000)
    assert best < 50e-6


async def test_record_from_another_thread(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    seen: list[dict[str, object]] = []
    async with AuditLog(str(path)) as log:
        log.add_hook(seen.append)
        await asyncio.to_thread(log.record, EVENT)
        await asyncio.sleep(0.01)  # the hook runs on the loop, via call_soon_threadsafe
    assert [r.get("host") for r in read_records(path)] == [None, "pypi.org", None]
    assert [e["host"] for e in seen] == ["pypi.org"]


async def test_rotate_records_are_ordered_like_the_lines_around_them(tmp_path: Path) -> None:
    """Control records made by the writer thread take the `ts` of the line they follow, not
    the thread's own later clock reading (docs/audit-log.md#timestamps). The lines here are
    stamped ahead of the clock, as a line recorded before the writer got to it is."""
    path = tmp_path / "audit.jsonl"
    async with AuditLog(str(path), rotate_bytes=600) as log:
        for n in range(30):
            log.record({**EVENT, "ts": f"2099-01-01T00:00:{n:02d}.000Z"})
    files = [*sorted(tmp_path.glob("audit.jsonl.*.gz"), key=lambda p: -int(p.name.split(".")[2])),
             path]  # fmt: skip
    lines = [r for f in files for r in read_records(f)]
    assert sum(r.get("type") == "rotate" for r in lines) >= 5
    stamps = [r["ts"] for r in lines if r.get("type") not in ("start", "end")]
    assert stamps == sorted(stamps)


async def test_opened_builds_the_same_line_as_record(tmp_path: Path) -> None:
    """`opened` serializes its few fields itself (the hot path); the line must be exactly
    what `record` makes of the same event, escapes included, with a new id each time."""
    path = tmp_path / "audit.jsonl"
    hostile = 'evil"\n\x1b[31m\u202e\u00e9.test'
    event: dict[str, object] = {"client": "198.18.0.2:1", "method": "CONNECT", "host": hostile,
                                "port": 443, "addr": "198.18.0.3", "client_id": None}  # fmt: skip
    async with AuditLog(str(path)) as log:
        first = log.opened(event)
        second = log.opened({**event, "mode": "socks5", "client_id": "task-7"})
        log.opened({**event, "secret_token": "x"})  # not one of its fields: record() drops it
        log.record({"type": "open", "id": first, **event})
    assert second == first + 1
    lines = [r for r in read_records(path) if r.get("type") == "open"]
    assert lines[0]["host"] == hostile
    assert lines[1]["client_id"] == "task-7"
    assert "secret_token" not in lines[2]
    strip = [{k: v for k, v in r.items() if k not in ("seq", "prev", "ts")} for r in lines]
    assert strip[0] == strip[3]
    raw = path.read_bytes().splitlines()
    assert all(line.isascii() for line in raw)


async def test_a_burst_beyond_a_batch_and_close_with_lines_pending(tmp_path: Path) -> None:
    """More lines than one batch (`BATCH_LINES`) in one loop iteration, one from another
    thread, then closed at once: every line written once, in order, chained."""
    path = tmp_path / "audit.jsonl"
    total = BATCH_LINES * 2 + 17
    async with AuditLog(str(path)) as log:
        log.record({**EVENT, "n": -1})
        await log.flush()
        for number in range(total):
            log.record({**EVENT, "n": number})
        await asyncio.to_thread(log.record, {**EVENT, "n": total})
        for number in range(total + 1, total + 5):
            log.record({**EVENT, "n": number})
    records = read_records(path)
    numbers = [r["n"] for r in records if "n" in r]
    assert sorted(numbers) == list(range(-1, total + 5))
    own = [n for n in numbers if n != total]  # the other thread's line may come earlier
    assert own == [n for n in range(-1, total + 5) if n != total]  # the loop's lines in order
    assert records[-1]["type"] == "end"
    assert records[-1]["lines"] == len(records) - 1
    assert log.lines_dropped == 0
    assert log.lines_abandoned == 0
    assert verify(path) == []


async def test_closed_mode_keeps_a_reserve_past_the_end_and_gives_it_back(tmp_path: Path) -> None:
    """docs/audit-log.md#the-reserve: the blocks past the end are the file's (allocated),
    its size and content unchanged; given back at rotation and at close."""
    path = tmp_path / "audit.jsonl"
    reserve = 1 << 20
    log = AuditLog(str(path), fail_mode="closed", reserve_bytes=reserve, rotate_bytes=4000)
    await log.start()
    for n in range(10):
        log.record({"client": "198.18.0.2:1", "method": "GET", "host": f"h{n}.test"})
    await log.flush()
    st = os.stat(path)
    if st.st_blocks * 512 < reserve:
        pytest.skip("this file system cannot allocate past the end (no fallocate)")
    assert b"\0" not in path.read_bytes()
    assert st.st_size < 4000
    for n in range(40):  # rotations: each rotated file gives its reserve back
        log.record({"client": "198.18.0.2:1", "method": "GET", "host": f"r{n}.test"})
    await log.flush()
    assert os.stat(path).st_blocks * 512 >= reserve
    for rotated in tmp_path.glob("audit.jsonl.*"):
        assert rotated.stat().st_blocks * 512 < 64 * 1024, rotated
    await log.aclose()
    assert os.stat(path).st_blocks * 512 < 64 * 1024  # given back at close
    assert log.writable
    assert log.write_errors == 0

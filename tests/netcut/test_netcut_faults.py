"""Faults that must lose nothing (docs/netcut.md#the-journal): the namespace worker killed at
every step boundary of a cut, a partial namespace without a record, and a state directory
that is read-only or full (a real tmpfs mounted for the test and always unmounted).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Iterator

import pytest
from netcut_testlib import Topology, sh, wait_for

import netcut
from netcut.direct import executor as apply
from netcut.direct import worker as nsexec
from netcut.records import Store

pytestmark = pytest.mark.netns


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "netcut.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


def snapshot(ns: str) -> dict[str, str]:
    """Routes (every table, both families), policy rules, addresses, netfilter rules and the
    IPv6 sysctls of every interface, as text."""
    out = {}
    for family in ("-4", "-6"):
        out[f"route{family}"] = sh("ip", "-n", ns, family, "route", "show", "table", "all").stdout
        out[f"rule{family}"] = sh("ip", "-n", ns, family, "rule").stdout
        out[f"addr{family}"] = sh("ip", "-n", ns, family, "-o", "addr").stdout
    for tool in ("iptables-legacy-save", "ip6tables-legacy-save"):
        text = sh("ip", "netns", "exec", ns, tool).stdout
        out[tool] = "\n".join(x for x in text.splitlines() if x.startswith(("-", ":NETCUT")))
    keys = sh("ip", "netns", "exec", ns, "sh", "-c",
              "grep -H . /proc/sys/net/ipv6/conf/*/disable_ipv6 "
              "/proc/sys/net/ipv6/conf/*/accept_ra")  # fmt: skip
    out["sysctl"] = keys.stdout
    return out


def ns_identity(ns: str) -> tuple[int, int]:
    st = os.stat(f"/run/netns/{ns}")
    return (st.st_dev, st.st_ino)


@pytest.fixture
def killer(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Workers started while this runs obey NETCUT_FAULT_KILL_AFTER_OP; none outlive it."""
    yield
    monkeypatch.delenv(apply.FAULT_ENV, raising=False)
    nsexec.stop_workers()


def kill_after(monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    monkeypatch.setenv(apply.FAULT_ENV, str(step))
    nsexec.stop_workers()  # the next job starts a worker that reads it


def test_worker_killed_at_every_step_boundary_restore_is_exact(
    topo: Topology, monkeypatch: pytest.MonkeyPatch, killer: None
) -> None:
    before = snapshot(topo.sandbox)
    planned = netcut.cut(topo.sandbox, [topo.proxy], dry_run=True).plan
    assert planned is not None
    assert len(planned.ops) >= 10, planned.lines()
    store = Store.for_namespace(ns_identity(topo.sandbox))
    for step in range(len(planned.ops)):
        kill_after(monkeypatch, step)
        with pytest.raises(netcut.ApplyFailed) as failed:
            netcut.cut(topo.sandbox, [topo.proxy], probe=False)
        assert not failed.value.rolled_back, (step, str(failed.value))
        record = store.load()
        assert record is not None, f"step {step}: the record was removed"
        assert record.applied == step + 1
        # partial until the ops that status verifies have all run (the last: flows)
        found = netcut.status(topo.sandbox).state
        assert found == "partial" if step < 4 else found in ("partial", "cut"), (step, found)
        restored = netcut.restore(topo.sandbox)
        assert restored.changed, step
        assert not os.path.exists(store.path)
        # IPv6 link-local addresses and routes come back as the kernel regenerates them
        if not wait_for(lambda: snapshot(topo.sandbox) == before):
            now = snapshot(topo.sandbox)
            diff = {k: (before[k], now[k]) for k in before if before[k] != now[k]}
            raise AssertionError(f"step {step} ({planned.ops[step]}): {diff}")


def test_cli_kill_mid_apply_keeps_the_record_and_restore_puts_routes_back(
    topo: Topology, monkeypatch: pytest.MonkeyPatch, killer: None
) -> None:
    """The issue's run: routes deleted, sysctls not yet set, the worker killed."""
    before = snapshot(topo.sandbox)
    planned = netcut.cut(topo.sandbox, [topo.proxy], dry_run=True).plan
    assert planned is not None
    last_route = max(i for i, op in enumerate(planned.ops) if type(op).__name__ == "DelRoute")
    env = dict(os.environ, **{apply.FAULT_ENV: str(last_route)})
    done = cli("cut", "--netns", topo.sandbox, "--keep", topo.proxy, "--json", env=env)
    assert done.returncode == 1, done.stderr
    data = json.loads(done.stdout)
    assert data["kind"] == "ApplyFailed"
    assert "nothing was rolled back" in data["error"]
    assert "Traceback" not in done.stderr
    assert "default" not in sh("ip", "-n", topo.sandbox, "route").stdout

    status = cli("status", "--netns", topo.sandbox)
    assert status.stdout.splitlines()[0] == "partial"
    assert "no restore record" not in status.stdout
    restore = cli("restore", "--netns", topo.sandbox)
    assert restore.returncode == 0, restore.stderr
    assert "not put back" not in restore.stdout
    assert wait_for(lambda: snapshot(topo.sandbox) == before)
    assert topo.reaches(topo.upstream_ip, topo.echo_port)


def test_partial_namespace_without_record_is_refused_before_any_change(
    topo: Topology, monkeypatch: pytest.MonkeyPatch, killer: None
) -> None:
    planned = netcut.cut(topo.sandbox, [topo.proxy], dry_run=True).plan
    assert planned is not None
    last_route = max(i for i, op in enumerate(planned.ops) if type(op).__name__ == "DelRoute")
    kill_after(monkeypatch, last_route)
    with pytest.raises(netcut.ApplyFailed):
        netcut.cut(topo.sandbox, [topo.proxy], probe=False)
    monkeypatch.delenv(apply.FAULT_ENV)
    nsexec.stop_workers()
    store = Store.for_namespace(ns_identity(topo.sandbox))
    os.unlink(store.path)  # the record lost (the failure mode this refusal guards)
    partial = snapshot(topo.sandbox)

    with pytest.raises(netcut.UnsafeTarget, match="no record"):
        netcut.cut(topo.sandbox, [topo.proxy], probe=False)

    assert snapshot(topo.sandbox) == partial, "the refused cut changed the namespace"
    assert not os.path.exists(store.path)


# ------------------------------------------------ the state directory: read-only, full


@pytest.fixture
def small_tmpfs(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[pathlib.Path]:
    """A 256 KiB tmpfs as $NETCUT_STATE_DIR, unmounted whatever happens."""
    point = tmp_path / "state"
    point.mkdir()
    sh("mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "netcut-test", str(point))
    try:
        monkeypatch.setenv("NETCUT_STATE_DIR", str(point))
        yield point
    finally:
        sh("umount", "-l", str(point), check=False)


def fill(directory: pathlib.Path) -> None:
    """Fill the filesystem until the kernel says ENOSPC."""
    fd = os.open(directory / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    with pytest.raises(OSError, match="No space left"):
        (directory / "probe-write").write_bytes(b"x" * 4096)


def one_line_state_error(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("netcut: error: state directory"), lines
    data = json.loads(done.stdout)
    assert data["kind"] == "StateError"
    assert data["exit_code"] == 2


def test_full_state_directory_cut_refuses_cleanly_restore_works(
    topo: Topology, small_tmpfs: pathlib.Path
) -> None:
    before = snapshot(topo.sandbox)
    netcut.cut(topo.peer, [], probe=False)  # a record written before the fill
    fill(small_tmpfs)

    done = cli("cut", "--netns", topo.sandbox, "--keep", topo.proxy, "--json")

    one_line_state_error(done)
    assert "No space left" in done.stderr
    assert snapshot(topo.sandbox) == before, "nothing may change"
    assert not [p.name for p in small_tmpfs.iterdir() if p.name.endswith(".tmp")]
    restore = cli("restore", "--netns", topo.peer, "--json")
    assert restore.returncode == 0, restore.stderr
    assert json.loads(restore.stdout)["result"] == "restored"


def test_read_only_state_directory_cut_and_restore_refuse_cleanly(
    topo: Topology, small_tmpfs: pathlib.Path
) -> None:
    netcut.cut(topo.peer, [], probe=False)
    before = snapshot(topo.sandbox)
    sh("mount", "-o", "remount,ro", str(small_tmpfs))

    done = cli("cut", "--netns", topo.sandbox, "--keep", topo.proxy, "--json")
    one_line_state_error(done)
    assert "Read-only" in done.stderr
    assert snapshot(topo.sandbox) == before

    restore = cli("restore", "--netns", topo.peer, "--json")
    one_line_state_error(restore)
    assert netcut.status(topo.peer).is_cut, "a refused restore leaves the cut as it was"

    sh("mount", "-o", "remount,rw", str(small_tmpfs))
    assert netcut.restore(topo.peer).changed
    assert not [p.name for p in small_tmpfs.iterdir() if p.name.endswith(".tmp")]

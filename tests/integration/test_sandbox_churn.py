"""Churn without leftovers (issue 23): sandboxes made, prepared, released and destroyed over
and over leave no netcut record, listener or fd behind, whether released with `restore=True`
or with `restore=False` for a sandbox about to be destroyed; records of namespaces destroyed
without a release are collected by `netcut gc` and by a later cut. Real namespaces, the real
API, netcut's real workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading

import pytest

import netcut
from egress import EgressProxy, Policy, build_settings, prepare_execution, release_execution
from netcut import collect
from netcut.direct import worker as nsexec

pytestmark = pytest.mark.userns
CYCLES = 24


@pytest.fixture
def state_dir(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> str:
    path = os.path.join(str(tmp_path), "netcut-state")
    monkeypatch.setenv("NETCUT_STATE_DIR", path)
    return path


def records(directory: str) -> list[str]:
    try:
        return sorted(n for n in os.listdir(directory) if n.endswith(".json"))
    except FileNotFoundError:
        return []


def make_ns(name: str) -> str:
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=30)
    subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True, timeout=30)
    return name


def drop_ns(name: str) -> None:
    subprocess.run(["ip", "netns", "del", name], check=False, timeout=30)


def open_fds() -> dict[int, str]:
    """This process's descriptors and what each is (a path, `socket:[inode]`, `anon_inode:…`),
    so that a count that moved says which one it was."""
    fds: dict[int, str] = {}
    for entry in os.listdir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):  # listdir's own descriptor, now closed
            fds[int(entry)] = os.readlink(f"/proc/self/fd/{entry}")
    return fds


def describe(fd: int, what: str) -> str:
    """A socket's family, type and addresses besides its inode (which says little by itself)."""
    if not what.startswith("socket:"):
        return what
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return what
    with sock:
        ends = []
        for end in (sock.getsockname, sock.getpeername):
            try:
                ends.append(repr(end()))
            except OSError:
                ends.append("-")
        return f"{what} {sock.family.name} {sock.type.name} {' -> '.join(ends)}"


def fd_diff(before: dict[int, str], after: dict[int, str]) -> str:
    """The descriptors that came and went, and the threads alive (a pool's thread may hold one)."""
    gone = {fd: what for fd, what in before.items() if after.get(fd) != what}
    new = {fd: describe(fd, what) for fd, what in after.items() if before.get(fd) != what}
    threads = sorted(t.name for t in threading.enumerate())
    return f"opened {new}, closed {gone}; threads {threads}"


async def connections_closed(proxy: EgressProxy) -> None:
    """Until the proxy holds no client connection. A released sandbox's listener closes at
    once, and the connections it accepted with it, but one accepted late (the cut's probe,
    which a busy proxy may accept after the probe returned: `ListenerProbe`) may still be
    becoming a transport at the release: it is closed when the transport is made, a few
    loop turns later, and a count of descriptors right after the release saw its socket."""
    async with asyncio.timeout(30):
        while proxy.metrics()["open_connections"]:
            await asyncio.sleep(0.01)  # (polls a condition: the connections' last callbacks)


def ns_name(i: int) -> str:
    return f"ncch{os.getpid() % 10000}x{i}"


async def test_churn_leaves_no_record_listener_or_fd(state_dir: str) -> None:
    proxy = EgressProxy(build_settings({}), listen=["127.0.0.1:0"])
    await proxy.start()
    try:
        listeners = len(proxy.listeners)
        # a first cycle warms up what stays for the proxy's lifetime: netcut's workers'
        # sockets, and the namespace pool's thread, which holds its home namespace open
        # (egress/proxy/net/netns.py; one, since these jobs come one after another)
        for warm in (True, False):
            name = make_ns(ns_name(99))
            try:
                ex = await prepare_execution(name, Policy(), proxy)
                await release_execution(proxy, ex, restore=warm, forget=not warm)
            finally:
                drop_ns(name)
        # netcut's pool at its full size: a second worker starts only when two jobs overlap,
        # which on a loaded machine may first happen mid-loop (one more fd, not a leak)
        nsexec.start_worker()
        await connections_closed(proxy)
        fds = open_fds()
        for cycle in range(CYCLES):
            name = make_ns(ns_name(cycle % 4))
            try:
                ex = await prepare_execution(name, Policy(), proxy)
                assert ex.cut.status.is_cut
                assert len(records(state_dir)) == 1
                restore = cycle % 2 == 0
                await release_execution(proxy, ex, restore=restore, forget=not restore)
            finally:
                drop_ns(name)
            assert records(state_dir) == [], f"cycle {cycle} (restore={restore}) left a record"
        assert len(proxy.listeners) == listeners
        await connections_closed(proxy)
        after = open_fds()
        assert len(after) == len(fds), fd_diff(fds, after)
    finally:
        await proxy.stop()


async def test_release_without_forget_keeps_the_record_of_a_live_namespace(
    state_dir: str,
) -> None:
    """The record is what a later restore needs: it goes only when asked or when the
    namespace is gone."""
    proxy = EgressProxy(build_settings({}), listen=["127.0.0.1:0"])
    await proxy.start()
    name = make_ns(ns_name(50))
    try:
        ex = await prepare_execution(name, Policy(), proxy)
        await release_execution(proxy, ex)
        assert len(records(state_dir)) == 1
        assert netcut.status(name).is_cut
        assert netcut.restore(name).changed
        ex = await prepare_execution(name, Policy(), proxy)
        drop_ns(name)  # destroyed before its release
        await release_execution(proxy, ex)
        assert records(state_dir) == []
    finally:
        drop_ns(name)
        await proxy.stop()


def key(name: str) -> str:
    st = os.stat(f"/run/netns/{name}")
    return f"{st.st_dev}-{st.st_ino}.json"


def reused(record: str) -> bool:
    """The kernel gives a destroyed namespace's inode number to the next new one: on a busy
    host another namespace may hold it already, and its record then looks alive (a stale
    record, which status ignores: docs/netcut.md#status)."""
    dev, ino = record.removesuffix(".json").split("-")
    return (int(dev), int(ino)) in collect.live_namespaces()


def test_gc_and_the_next_cut_collect_records_of_destroyed_namespaces(state_dir: str) -> None:
    live, dead, later = (make_ns(ns_name(i)) for i in (60, 61, 62))
    try:
        for name in (live, dead):
            netcut.cut(name, [])
        dead_key, live_key = key(dead), key(live)
        drop_ns(dead)
        assert records(state_dir) == sorted([dead_key, live_key])

        done = subprocess.run(
            [sys.executable, "-m", "netcut.cli", "gc", "--json"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

        assert done.returncode == 0, done.stderr
        data = json.loads(done.stdout)
        left = records(state_dir)
        assert live_key in left, "a live namespace keeps its record"
        assert dead_key not in left or reused(dead_key)
        assert [f"{k}.json" for k in data["removed"]] == [k for k in [dead_key] if k not in left]
        assert netcut.status(live).is_cut

        netcut.cut(later, [])
        later_key = key(later)
        drop_ns(later)
        nsexec.stop_workers()  # a fresh worker collects at its first cut
        netcut.restore(live)
        netcut.cut(live, [])
        left = records(state_dir)
        assert later_key not in left or reused(later_key), "the cut collected it"
        assert live_key in left
        assert netcut.restore(live).changed
    finally:
        for name in (live, dead, later):
            drop_ns(name)

"""A netfilter backend is one module (docs/netcut.md#backends): its `ShellNetfilter` serves
both modes, direct mode running its commands in the namespace (direct/shellface.py).

The proof drives the real executor (flow.py's cut, restore and status, in netcut's worker, in
a real namespace) through the iptables backend's shell face *alone* (iptables_text.py, one
module), without its native python-iptables face. What it writes is then read by the native
face (`netcut.status`) as the same cut, and the cut holds on the wire.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from netcut_testlib import Topology, sh

import netcut
from netcut import flow
from netcut.direct import executor, shellface
from netcut.direct.worker import ns_identity, run_in_netns
from netcut.iptables_shell import IptablesShell
from netcut.netfilter import Netfilter, backend
from netcut.plan.model import parse_keep
from netcut.plan.status import CutStatus
from netcut.records import Store

pytestmark = pytest.mark.netns


class CommandsOnly(IptablesShell):
    """The iptables backend as a backend with no face of its own in the namespace: what an
    nftables module with only its `ShellNetfilter` would be."""

    def __init__(self) -> None:
        super().__init__()
        self.native = None


@contextmanager
def _through_commands() -> Iterator[None]:
    """In netcut's worker: the executor drives the backend's commands, then its choice is
    put back (the worker serves other jobs after this one)."""
    chosen = executor.NETFILTER
    executor.NETFILTER = shellface.in_namespace(CommandsOnly())
    try:
        yield
    finally:
        executor.NETFILTER = chosen


def job_cut(store: Store, label: str, req: flow.CutRequest) -> tuple[flow.CutResult, str]:
    with _through_commands():
        result = executor.job_cut(store, label, req)
        return result, type(executor.NETFILTER).__name__


def job_restore(store: Store, label: str) -> flow.RestoreResult:
    with _through_commands():
        return executor.job_restore(store, label)


def job_status(store: Store) -> CutStatus:
    with _through_commands():
        return executor.job_status(store)


def _run(ns: str, job: Any, *args: Any) -> Any:
    fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
    try:
        return run_in_netns(fd, job, Store.for_namespace(ns_identity(fd)), *args)
    finally:
        os.close(fd)


def _backstop(ns: str) -> list[str]:
    """Chain NETCUT's rules, [] when there is no such chain."""
    done = sh("ip", "netns", "exec", ns, "iptables-legacy", "-w", "-S", "NETCUT", check=False)
    return done.stdout.splitlines() if done.returncode == 0 else []


def test_a_backend_of_commands_alone_cuts_through_the_real_executor(topo: Topology) -> None:
    t = topo
    assert t.reaches(t.upstream_ip, t.echo_port), "upstream reachable before the cut"
    keep = parse_keep(t.proxy)
    blocked = (parse_keep(f"{t.upstream_ip}:{t.echo_port}"),)
    req = flow.CutRequest((keep,), expect_blocked=blocked)

    result, face = _run(t.sandbox, job_cut, t.sandbox, req)

    assert face == "ShellInNamespace"
    assert result.changed
    assert result.probe is not None
    assert result.probe.ok, result.probe.reason()
    assert t.reaches(t.gateway, t.proxy_port), "the kept ADDR:PORT still answers"
    assert not t.reaches(t.upstream_ip, t.echo_port)
    assert not t.reaches(t.peer_ip, t.echo_port)
    assert _backstop(t.sandbox), "the backstop is in the namespace"
    # the commands' status and the native face's agree: the same rules either way
    assert _run(t.sandbox, job_status).is_cut
    assert netcut.status(t.sandbox).is_cut

    restored = _run(t.sandbox, job_restore, t.sandbox)

    assert restored.changed
    assert t.reaches(t.upstream_ip, t.echo_port), "upstream reachable after the restore"
    assert not netcut.status(t.sandbox).is_cut
    assert _backstop(t.sandbox) == [], "the commands took the backstop out"


def test_the_native_face_is_chosen_when_named() -> None:
    """`backend()` is the one choice; direct mode takes its native face if it names one."""
    from netcut.direct.iptables import Iptables

    assert isinstance(executor.NETFILTER, Iptables)
    assert type(backend()) is IptablesShell
    commands: Netfilter = shellface.in_namespace(CommandsOnly())
    assert isinstance(commands, shellface.ShellInNamespace)
    assert commands.errors == (shellface.ShellFailed,)

"""A cut that does not hold by the time its status is read is reported, not passed off as
cut (real kernel, the real executor). `cut_and_status` (egress's prepare_execution) judges
the whole state read afresh after the cut against the plan it holds (docs/netcut.md#status):
here the namespace is changed between the cut's last op and that read, as another actor
could, and the answer must say so. The only thing injected is when the change happens."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Callable
from typing import Any

import pytest
from netcut_testlib import Topology

from netcut import flow
from netcut.direct import executor
from netcut.direct.worker import ns_identity, setns
from netcut.plan.model import parse_keep
from netcut.records import Journal, Store

pytestmark = pytest.mark.netns


def _in_namespace(path: str, fn: Callable[[], Any]) -> Any:
    """`fn()` in a thread that entered the namespace (it ends there; this thread stays)."""
    out: list[Any] = []
    failed: list[BaseException] = []

    def run() -> None:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            setns(fd)
            out.append(fn())
        except BaseException as exc:
            failed.append(exc)
        finally:
            os.close(fd)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return out[0]


def _cut_changed_after_apply(topo: Topology, change: list[str]) -> flow.CutStatus:
    path = f"/run/netns/{topo.sandbox}"
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        store = Store.for_namespace(ns_identity(fd))
    finally:
        os.close(fd)

    class ChangedAfterApply(executor.InNamespace):
        def apply_journaled(self, ops: Any, journal: Journal) -> None:
            super().apply_journaled(ops, journal)
            subprocess.run(["ip", "netns", "exec", topo.sandbox, *change], check=True)

    def cut() -> tuple[flow.CutResult, flow.CutStatus]:
        with ChangedAfterApply() as ex:
            request = flow.CutRequest((parse_keep(topo.proxy),), probe=False)
            return flow.cut_and_status(ex, store, topo.sandbox, request)

    result, status = _in_namespace(path, cut)
    assert result.changed
    assert result.status.is_cut, "the cut itself ran to its end"
    return status


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (["iptables-legacy", "-I", "OUTPUT", "-j", "ACCEPT"], "IPv4 backstop: output rule ahead"),
        (["iptables-legacy", "-F", "NETCUT"], "IPv4 backstop: it has 0 of the plan's"),
        (["sysctl", "-qw", "net.ipv6.conf.eth0.disable_ipv6=0"], "disable_ipv6 = 0 (the cut sets"),
    ],
    ids=["accept-ahead-of-jump", "backstop-flushed", "ipv6-back-on"],
)
def test_a_cut_changed_before_its_status_is_read_is_not_reported_cut(
    topo: Topology, change: list[str], named: str
) -> None:
    status = _cut_changed_after_apply(topo, change)
    assert not status.is_cut
    assert status.state == "partial"
    assert any(named in line for line in status.details), status.details


def test_a_way_out_added_before_the_status_is_read_is_reported(topo: Topology) -> None:
    gateway = topo.gateway
    status = _cut_changed_after_apply(
        topo, ["ip", "route", "add", "default", "via", gateway, "metric", "50"]
    )
    assert not status.is_cut
    assert any("route out not in the plan: default via" in line for line in status.details)

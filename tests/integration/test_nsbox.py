"""The namespace box under Harbor's `NamespaceEnvironment` (egress.integrations.nsbox), on a
real namespace: commands see the box's root, not the host's; nothing in it holds a
capability that could undo a cut (netcut's own safety scan agrees, while a command runs);
users switch; timeouts kill; paths cannot leave the root; stop leaves nothing behind."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from egress.integrations.nsbox import BoxError, NamespaceBox
from netcut.safety import identity_of, privileged_processes

import harness

pytestmark = pytest.mark.netns


@pytest.fixture
async def box(test_host_factory: object, tmp_path: Path) -> AsyncIterator[NamespaceBox]:
    host: harness.TestHost = test_host_factory()  # type: ignore[operator]
    made = NamespaceBox(tmp_path / "root", host.ns)
    await made.start()
    try:
        yield made
    finally:
        await made.stop()


async def test_commands_see_the_box_root(box: NamespaceBox) -> None:
    done = await box.exec("echo hi > /logs/agent/x && ls / && cat /logs/agent/x", cwd="/app")
    assert done.return_code == 0, done.stderr
    assert {"logs", "solution", "tests", "usr", "app"} <= set(done.stdout.split())
    assert (box.root / "logs" / "agent" / "x").read_text() == "hi\n"
    assert not Path("/logs/agent/x").exists()
    ro = await box.exec("touch /usr/egress-nsbox-probe")
    assert ro.return_code != 0  # the host's /usr is read-only in the box


async def test_nothing_in_the_box_could_undo_a_cut(box: NamespaceBox) -> None:
    fifo = box.root / "tmp" / "gate"
    os.mkfifo(fifo)
    running = asyncio.create_task(box.exec("grep CapBnd /proc/self/status; cat /tmp/gate"))
    # opening the FIFO for writing returns once the command has opened it: it is running
    gate = await asyncio.to_thread(open, fifo, "w")
    identity = identity_of(f"/run/netns/{box.netns}")
    assert identity is not None
    assert privileged_processes(identity) == ()  # the holder and the command both
    gate.close()
    done = await running
    bounding = int(done.stdout.split()[1], 16)
    for cap in (12, 13, 21):  # NET_ADMIN, NET_RAW, SYS_ADMIN
        assert not bounding & (1 << cap)
    assert bounding & (1 << 0)  # CHOWN stays: root in the box is otherwise root


async def test_users_and_timeouts(box: NamespaceBox) -> None:
    assert (await box.exec("id -u", user="nobody")).stdout.strip() == "65534"
    assert (await box.exec("id -u", user=4321)).stdout.strip() == "4321"
    with pytest.raises(BoxError, match="no user"):
        await box.exec("id -u", user="no-such-user-here")
    slow = await box.exec("sleep 30", timeout_sec=0.5)
    assert slow.return_code == 124


async def test_paths_stay_inside(box: NamespaceBox, tmp_path: Path) -> None:
    (box.root / "tmp" / "out").symlink_to("/etc")
    for path in ("/../../etc/passwd", "/tmp/out/passwd", "relative"):
        with pytest.raises(BoxError):
            box.host_path(path)
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("a")
    box.upload(src, "/solution")
    box.download("/solution", tmp_path / "back")
    assert (tmp_path / "back" / "a.txt").read_text() == "a"


async def test_stop_removes_the_root_and_its_mounts(test_host_factory: object,
                                                    tmp_path: Path) -> None:  # fmt: skip
    host: harness.TestHost = test_host_factory()  # type: ignore[operator]
    made = NamespaceBox(tmp_path / "root", host.ns)
    await made.start()
    await made.stop()
    await made.stop()  # idempotent
    assert not (tmp_path / "root").exists()
    assert str(tmp_path) not in Path("/proc/self/mountinfo").read_text()

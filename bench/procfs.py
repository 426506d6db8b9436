"""Proxy cost from /proc: CPU time and memory of a process tree.

CPU is utime+stime (clock ticks) summed over the root process and all its descendants, so
squid's helpers and any worker processes count. Memory is sampled at 10 Hz by a thread:
RSS (VmRSS) and PSS (smaps_rollup) summed over the tree.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
SAMPLE_INTERVAL_S = 0.1  # 10 Hz, as the anchors were sampled


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids.extend(int(k) for k in f.read().split())
    except OSError:
        pass
    return kids


def tree(pid: int) -> list[int]:
    """The pid and all its live descendants."""
    seen, todo = [], [pid]
    while todo:
        p = todo.pop()
        seen.append(p)
        todo.extend(_children(p))
    return seen


def _cpu_ticks(pid: int) -> tuple[int, int]:
    """(user, system) clock ticks of one process, its reaped children's included."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0, 0
    # utime, stime, cutime, cstime (fields 14-17 of stat): a helper that exits and is reaped
    # moves its time into its parent's cutime/cstime, so the tree total stays consistent.
    return int(fields[11]) + int(fields[13]), int(fields[12]) + int(fields[14])


def cpu_split_seconds(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of the tree rooted at pid. The system part is the kernel
    working for the proxy (accept, connect, send, receive, epoll, close): the same calls
    for every proxy, so it bounds how cheap a proxy's connection can get
    (docs/benchmarks.md#kernel-time)."""
    user = system = 0
    for p in tree(pid):
        u, s = _cpu_ticks(p)
        user += u
        system += s
    return user / CLK_TCK, system / CLK_TCK


def cpu_seconds(pid: int) -> float:
    """utime+stime of the tree rooted at pid, in seconds."""
    return sum(cpu_split_seconds(pid))


def _status_kb(pid: int, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def memory_mb(pid: int) -> tuple[float, float]:
    """(RSS, PSS) of the tree rooted at pid, in MB (10^6 bytes)."""
    pids = tree(pid)
    rss = sum(_status_kb(p, "VmRSS:") for p in pids)
    pss = sum(_pss_kb(p) for p in pids)
    return rss * 1024 / 1e6, pss * 1024 / 1e6


@dataclass
class MemorySampler:
    """Samples memory_mb(pid) at 10 Hz in a thread.

    peak_rss/peak_pss are the maxima since reset(); max_rss/max_pss since the start.
    """

    pid: int
    peak_rss: float = 0.0
    peak_pss: float = 0.0
    max_rss: float = 0.0
    max_pss: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> MemorySampler:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()

    def reset(self) -> None:
        self.peak_rss = self.peak_pss = 0.0

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_INTERVAL_S):
            rss, pss = memory_mb(self.pid)
            self.peak_rss = max(self.peak_rss, rss)
            self.peak_pss = max(self.peak_pss, pss)
            self.max_rss = max(self.max_rss, rss)
            self.max_pss = max(self.max_pss, pss)


def idle_memory(pid: int, seconds: float = 0.5) -> tuple[float, float]:
    """Idle memory: the maximum (RSS, PSS) in MB over a short quiet window at 10 Hz."""
    rss = pss = 0.0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        r, p = memory_mb(pid)
        rss, pss = max(rss, r), max(pss, p)
        time.sleep(SAMPLE_INTERVAL_S)
    return rss, pss


def cpu_busy_seconds(cpu: int) -> float:
    """Time one CPU spent running tasks since boot (/proc/stat user + nice + system).

    Interrupt and softirq time (loopback packet processing) is left out on purpose: it is
    not charged to any task either, so "busy minus our tasks" is other tasks' work.
    """
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith(f"cpu{cpu} "):
                user, nice, system = (int(x) for x in line.split()[1:4])
                return (user + nice + system) / CLK_TCK
    return 0.0


def cpu_steal_seconds(cpu: int) -> float:
    """Time the hypervisor ran someone else on this virtual CPU since boot (/proc/stat
    steal). A stolen core runs every proxy slower, the direct path too, and no process on
    this machine is charged for it, so `other_work_pct` cannot see it: the report states it."""
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith(f"cpu{cpu} "):
                return int(line.split()[8]) / CLK_TCK
    return 0.0


def other_work_pct(window_s: float = 0.5) -> float:
    """How busy both CPUs are with work outside this process tree, over a short window:
    100 means one whole core's worth of someone else's work.
    """
    me = os.getpid()
    busy0 = cpu_busy_seconds(0) + cpu_busy_seconds(1)
    ours0 = cpu_seconds(me)
    time.sleep(window_s)
    busy = cpu_busy_seconds(0) + cpu_busy_seconds(1) - busy0
    ours = cpu_seconds(me) - ours0
    return 100 * max(0.0, busy - ours) / window_s


def wait_quiet(max_wait_s: float, limit_pct: float = 10.0) -> tuple[float, float]:
    """Wait (at most max_wait_s) until other work on the machine is below limit_pct.

    Returns (seconds waited, the last other-work figure).
    """
    t0 = time.monotonic()
    other = other_work_pct()
    while other > limit_pct and time.monotonic() - t0 < max_wait_s:
        other = other_work_pct()
    return time.monotonic() - t0, other

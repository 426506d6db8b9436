"""`egress serve --workers N`: N proxy processes sharing each listen port (docs/proxy.md#workers).

One event loop uses one core. To use more, the parent reserves every listen address (binding
with SO_REUSEPORT resolves port 0 to one concrete port for all), forks N workers that each
open their own SO_REUSEPORT listener on it (the kernel spreads new connections across them),
waits until all of them accept, then prints the `listening on` lines itself: one per listener,
as without workers. Each worker writes its own audit chain, `audit.jsonl` -> `audit.w0.jsonl`,
`audit.w1.jsonl`, ... (docs/audit-log.md#several-workers). SIGTERM or SIGINT to the parent is
passed to every worker, each stops gracefully (the same grace as a single process), and the
parent exits 0 once all have. SIGHUP to the parent is a rolling reload: passed to each worker
in turn, and each re-reads the policy file. A worker that dies on its own takes the service
down (exit 1): a supervisor restarts the whole set, never a half-served port.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import os
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import PurePath

from .config import Settings

READY = b"ready\n"
_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGHUP}


def worker_audit_path(path: str, index: int) -> str:
    """`/x/audit.jsonl` -> `/x/audit.w0.jsonl`; a name without a suffix gets `.w0` appended."""
    p = PurePath(path)
    if p.suffix:
        return str(p.with_name(f"{p.stem}.w{index}{p.suffix}"))
    return f"{path}.w{index}"


def check_worker_args(args: argparse.Namespace) -> str | None:
    """Why `--workers` cannot serve these options, or None."""
    if args.workers < 1:
        return "--workers must be at least 1"
    if args.workers == 1:
        return None
    if args.audit_log == "-":
        return "--workers needs --audit-log to be a file (one chain per worker), not '-'"
    if args.listen_netns:
        return "--workers cannot be combined with --listen-netns"
    return None


def reserve(host: str, port: int) -> socket.socket:
    """Bind (not listen) with SO_REUSEPORT: fixes the port every worker then listens on."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def serve_workers(
    args: argparse.Namespace,
    settings: Settings,
    run_worker: Callable[[argparse.Namespace, Settings, int], int],
    listens: list[tuple[str, int]],
) -> int:
    """Run `run_worker(worker_args, settings, ready_fd)` in args.workers forked processes.

    `run_worker` must write READY to `ready_fd` once its listeners accept, and must not
    print `listening on` lines (the parent does, once for all).
    """
    try:
        reserved = [reserve(host, port) for host, port in listens]
    except OSError as exc:
        print(f"egress serve: cannot listen: {exc.strerror or exc}", file=sys.stderr)
        return 2
    bound = [(str(s.getsockname()[0]), int(s.getsockname()[1])) for s in reserved]
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    pids: list[int] = []
    readers: list[int] = []
    try:
        for index in range(args.workers):
            r, w = os.pipe()
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:  # the worker
                os.close(r)
                for fd in readers:
                    os.close(fd)
                for s in reserved:
                    s.close()
                signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
                _whole_lines()
                _die_with_parent()
                _exit_worker(run_worker, _worker_args(args, bound, index), settings, w)
            os.close(w)
            pids.append(pid)
            readers.append(r)
        failed = [i for i, fd in enumerate(readers) if not _wait_ready(fd)]
        for s in reserved:
            s.close()
        if failed:
            print(f"egress serve: worker(s) {failed} did not start", file=sys.stderr)
            _stop_all(pids)
            return 2
        for host, port in bound:
            shown = f"[{host}]" if ":" in host else host
            print(f"listening on {shown}:{port}", flush=True)
        return _supervise(pids)
    finally:
        for fd in readers:
            with contextlib.suppress(OSError):
                os.close(fd)
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)


def _worker_args(
    args: argparse.Namespace, bound: list[tuple[str, int]], index: int
) -> argparse.Namespace:
    mine = copy.copy(args)
    mine.listen = [f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in bound]
    mine.workers = 1
    mine.worker_index = index
    mine.worker_count = args.workers  # named in each worker's start records
    if args.audit_log:
        mine.audit_log = worker_audit_path(args.audit_log, index)
    return mine


def _exit_worker(
    run_worker: Callable[[argparse.Namespace, Settings, int], int],
    args: argparse.Namespace,
    settings: Settings,
    ready_fd: int,
) -> None:
    code = 70
    try:
        code = run_worker(args, settings, ready_fd)
    except KeyboardInterrupt:
        code = 130
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _whole_lines() -> None:
    """Every worker writes to the same stdout/stderr pipes as its siblings and the parent.
    Unbuffered stdio (`python -u`, PYTHONUNBUFFERED) makes `print` two writes, the text and
    then its newline, so two workers reloading at once interleaved into one line
    ("...-> sha256:aegress serve: policy reloaded: ...") and a reader counting lines saw one
    reload. Line buffering hands each line to the pipe in one write, which the kernel keeps
    whole up to PIPE_BUF bytes (docs/proxy.md#sighup)."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(line_buffering=True, write_through=False)


def _die_with_parent() -> None:
    """A worker gets SIGTERM if the parent dies without stopping it (SIGKILL, crash), so no
    orphan keeps serving the port (Linux prctl PR_SET_PDEATHSIG; best effort elsewhere)."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)


def _wait_ready(fd: int) -> bool:
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 64)
        if not chunk:
            return False
        data += chunk
    return data == READY


def _supervise(pids: list[int]) -> int:
    """Wait for SIGTERM/SIGINT (pass it on), SIGHUP (a rolling reload: passed to each
    worker in turn, worker 0 first; each re-reads the policy file as a single process does,
    docs/proxy.md#sighup) or a worker's death (stop the rest)."""
    live = set(pids)
    while live:
        sig = signal.sigwait(_SIGNALS)
        if sig == signal.SIGHUP:
            for pid in pids:
                if pid in live:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGHUP)
            continue
        if sig != signal.SIGCHLD:
            _signal_all(live, signal.SIGTERM)
            return _reap_all(live)
        died = _reap(live, block=False)
        if died:
            print(
                f"egress serve: worker pid(s) {sorted(died)} exited; stopping the others",
                file=sys.stderr,
            )
            _signal_all(live, signal.SIGTERM)
            _reap_all(live)
            return 1
    return 0


def _stop_all(pids: list[int]) -> None:
    live = set(pids)
    _signal_all(live, signal.SIGTERM)
    _reap_all(live)


def _signal_all(live: set[int], sig: int) -> None:
    for pid in live:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _reap(live: set[int], *, block: bool) -> dict[int, int]:
    """Reap exited workers from `live`; returns {pid: exit code}."""
    done: dict[int, int] = {}
    for pid in list(live):
        got, status = os.waitpid(pid, 0 if block else os.WNOHANG)
        if got:
            done[pid] = os.waitstatus_to_exitcode(status)
            live.discard(pid)
    return done


def _reap_all(live: set[int]) -> int:
    """Wait for every worker; 0 if all exited 0."""
    codes = _reap(live, block=True)
    return 0 if all(c == 0 for c in codes.values()) else 1

"""The helper container as an engine's CLI runs it (docs/netcut.md#helper-mode).

Shell. `helper_argv` is the one container run per operation: a `--rm -i` container in the
target's network namespace holding only NET_ADMIN and NET_RAW, never pulling (docker, podman,
or containerd's ctr). `CliHelper` is the transport over that client's pipes (the Engine API's
is engineapi.ApiHelper, with the same face); `why_failed` and `no_such_image` read what an
engine answered. The session held with the helper's shell is `helper/session.py`'s.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import select
import subprocess
import threading
import time

from netcut.errors import InvalidInput, TargetNotFound
from netcut.helper import image as helperimage

IMAGE_ENV = "NETCUT_HELPER_IMAGE"
# A helper container starts in a fraction of a second; a minute means the engine is wedged.
RUN_TIMEOUT_S = 60.0
CAPABILITIES = ("NET_ADMIN", "NET_RAW")
# What the engines answer for an image that is not there (with --pull never): docker's
# clients say `No such image: IMAGE`, podman `IMAGE: image not known`.
_NO_IMAGE = ("no such image", "image not known", "unable to find image")


def default_image() -> str:
    """The tag of the image assembled from this host's files (helper/image.py)."""
    return helperimage.image_tag()


# ctr's default capability set (containerd's oci.WithDefaultSpec); ctr 1.6 knows no
# `--cap-drop ALL`, so each is dropped but NET_RAW, which the helper needs.
_CTR_DEFAULT_CAPS = (
    "CHOWN",
    "DAC_OVERRIDE",
    "FSETID",
    "FOWNER",
    "MKNOD",
    "SETGID",
    "SETUID",
    "SETFCAP",
    "SETPCAP",
    "NET_BIND_SERVICE",
    "SYS_CHROOT",
    "KILL",
    "AUDIT_WRITE",
)
# Where a containerd helper sees the target's net sysctls writable (render.PRELUDE's NCUT_SYS).
CTR_SYS_NET = "/netcut/sys/net"


def is_ctr(runtime: str) -> bool:
    """Whether `runtime` is containerd's client, whose helper joins the namespace by path."""
    return os.path.basename(runtime) == "ctr"


def ctr_image(image: str) -> str:
    """An image reference as containerd stores it: docker's short names in full."""
    first = image.split("/", 1)[0]
    if "/" not in image:
        return f"docker.io/library/{image}"
    if "." in first or ":" in first or first == "localhost":
        return image
    return f"docker.io/{image}"


def helper_argv(
    runtime: str,
    container_id: str,
    image: str,
    *,
    netns: str | None = None,
    namespace: str | None = None,
    extra: tuple[str, ...] = (),
) -> list[str]:
    """argv of the helper run: shares only the network namespace, holds NET_ADMIN and
    NET_RAW only, reads its commands from stdin. docker and podman join the container's
    namespace (`--network container:ID`); containerd's `ctr run` joins it by the path of the
    task's namespace file (`netns`, `--with-ns network:PATH`) in containerd namespace
    `namespace`, and, since it cannot unmask /proc/sys, gets the target's net sysctls bound
    writable at /netcut/sys/net (resolved in the namespace it runs in). `extra`: more `run`
    options for docker and podman (helper/listeners.py's mount)."""
    caps = [arg for cap in CAPABILITIES for arg in ("--cap-add", cap)]
    if is_ctr(runtime):
        if netns is None or namespace is None:
            raise InvalidInput("a containerd helper needs the task's namespace file")
        drop = [arg for cap in _CTR_DEFAULT_CAPS for arg in ("--cap-drop", f"CAP_{cap}")]
        return [
            runtime,
            "-n",
            namespace,
            "run",
            "--rm",
            "--with-ns",
            f"network:{netns}",
            *drop,
            *(arg if arg == "--cap-add" else f"CAP_{arg}" for arg in caps),
            "--mount",
            f"type=bind,src=/proc/sys/net,dst={CTR_SYS_NET},options=rbind:rw",
            ctr_image(image),
            f"netcut-helper-{secrets.token_hex(6)}",
            "/bin/sh",
        ]
    podman = "podman" in os.path.basename(runtime)
    unmask = "unmask=/proc/sys" if podman else "systempaths=unconfined"
    return [
        runtime,
        "run",
        "-i",
        "--rm",
        "--pull",
        "never",
        "--log-driver",
        "none",
        "--network",
        f"container:{container_id}",
        "--cap-drop",
        "ALL",
        *caps,
        "--security-opt",
        unmask,
        *extra,
        "--entrypoint",
        "/bin/sh",
        image,
    ]


def why_failed(text: str, code: int | None) -> str:
    """Everything a failed command said, every line (its exit status if it said nothing).

    Whole, because the cause is rarely on the last line: Docker CE's client ends with
    `Run 'docker run --help' for more information`, Debian's 20.10 with
    `See 'docker run --help'.`, both after the daemon's `No such image: ...`."""
    lines = [line.rstrip() for line in text.strip().splitlines()]
    said = "\n".join(line for line in lines if line)
    return said or f"exit {code}"


def no_such_image(text: str) -> bool:
    """Whether an engine's answer to `run --pull never` says the image is not there: Docker CE
    28 and Debian's 20.10 client (`No such image: IMAGE`), podman (`IMAGE: image not known`),
    ctr (`ctr: image "IMAGE": not found`)."""
    lowered = text.lower()
    if 'ctr: image "' in lowered and '": not found' in lowered:
        return True
    return any(s in lowered for s in _NO_IMAGE)


def _drain(fd: int, deadline: float) -> None:
    """Read `fd` to its end (the helper's shell and container are gone) or the deadline."""
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], left)
        try:
            if ready and not os.read(fd, 65536):
                return
        except OSError:
            return


def _reap(proc: subprocess.Popen[bytes]) -> None:
    try:
        proc.wait(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stderr is not None:
        with contextlib.suppress(OSError):
            proc.stderr.close()


class CliHelper:
    """One helper container run by the engine's CLI (`helper_argv`): its stdin, stdout and
    stderr are the client's pipes. Same face as engineapi.ApiHelper."""

    def __init__(self, argv: list[str]) -> None:
        try:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
        except FileNotFoundError:
            raise TargetNotFound(f"container runtime {argv[0]} not found") from None

    def write(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def read(self, timeout: float) -> bytes | None:
        """The helper's next stdout bytes; b"" when it ended, None on timeout."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], max(timeout, 0))
        return os.read(fd, 65536) if ready else None

    def failure(self, timeout: float = 10.0) -> str:
        """Everything the client wrote to stderr, once it exited (or `timeout` passed)."""
        proc = self.proc
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
        text = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        return why_failed(text, proc.returncode)

    def close(self, wait: bool = True) -> None:
        """Close the shell's stdin and read its output to the end: the container's process
        is gone when this returns. The client's own exit, which waits for the engine's
        removal of the `--rm` container (~100 ms, nothing depends on it), is waited for with
        `wait`, else left to a thread (the client removes ctr's container itself: it must
        not be cut short)."""
        proc = self.proc
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        if proc.stdout is not None:
            _drain(proc.stdout.fileno(), time.monotonic() + RUN_TIMEOUT_S)
            with contextlib.suppress(OSError):
                proc.stdout.close()
        if wait:
            _reap(proc)
        else:
            threading.Thread(target=_reap, args=(proc,), daemon=True).start()


__all__ = [
    "CAPABILITIES",
    "IMAGE_ENV",
    "RUN_TIMEOUT_S",
    "CliHelper",
    "ctr_image",
    "default_image",
    "helper_argv",
    "is_ctr",
    "no_such_image",
    "why_failed",
]

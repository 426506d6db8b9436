"""A namespace box: a network namespace plus a private root directory, for running a
framework's sandbox commands on this machine without a container engine.

Strategy (docs/integrations.md#the-namespace-environment). A *holder* process is started in
the network namespace with a mount namespace of its own (`ip netns exec NS unshare --mount`);
inside it, the host's `/usr`, `/etc` and `/dev` are bind-mounted read-only (`/dev`
read-write) into the box's root, `/proc` is mounted, and the merged-`/usr` links (`/bin` ->
`usr/bin`, ...) are recreated. Every command enters the holder's mount and network
namespaces (`nsenter`) and runs under `chroot ROOT`, so absolute paths such as `/logs` or
`/solution` are the box's own, and the host never sees the bind mounts (they vanish with the
holder). Files are copied in and out on the host side, below the root, never following a
link out of it.

It isolates the *network* (the namespace, which `prepare_execution` then cuts) and keeps the
host's filesystem out of reach of ordinary writes; root inside a chroot is not a filesystem
security boundary, so it is for running and testing here, not a jail for hostile code.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import shlex
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

# host directories the box sees read-only, and the one it sees read-write
READ_ONLY = ("usr", "etc")
READ_WRITE = ("dev",)
# the box's own writable directories (Harbor's /logs, /solution, /tests and a workdir)
OWN_DIRS = ("tmp", "root", "proc", "app", "logs", "solution", "tests", "opt", "var", "home")
HOLDER_READY = "egress-nsbox-ready"
# Dropped from every process in the box (bounding set, so no setuid binary gives them back):
# the capabilities with which a process could undo a cut (docs/netcut.md#safety-rails).
# Docker's default set lacks NET_ADMIN and SYS_ADMIN too.
DROP = "-net_admin,-net_raw,-sys_admin"
SETPRIV = ["setpriv", f"--bounding-set={DROP}", "--inh-caps=-all"]
# an `ip netns exec` + `unshare` + a few mounts: seconds only on a loaded machine
START_TIMEOUT = 30.0


class BoxError(RuntimeError):
    """The box could not be set up, or a path leaves its root."""


@dataclass(frozen=True)
class BoxResult:
    stdout: str
    stderr: str
    return_code: int


class NamespaceBox:
    """A root directory and a holder process in network namespace `netns` (a name under
    /run/netns). `start()` before use, `stop()` after; `stop()` is idempotent."""

    def __init__(self, root: Path, netns: str) -> None:
        self.root = root
        self.netns = netns
        self._holder: asyncio.subprocess.Process | None = None

    @property
    def holder_pid(self) -> int:
        if self._holder is None:
            raise BoxError("the namespace box is not started")
        return self._holder.pid

    async def start(self) -> None:
        """Lay out the root and start the holder. Raises `BoxError` if the holder does not
        come up (its stderr is in the message)."""
        self._layout()
        # The holder says it is ready only once it runs without the capabilities that could
        # undo a cut: said before `setpriv`, a loaded machine let a caller see it still `sh`
        # with them all (test_nothing_in_the_box_could_undo_a_cut).
        ready = shlex.quote(f"echo {HOLDER_READY} && exec sleep infinity")
        script = "set -e\n" + _mount_script(self.root) + f"exec {' '.join(SETPRIV)} sh -c {ready}\n"
        argv = [
            "ip",
            "netns",
            "exec",
            self.netns,
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
        ]
        self._holder = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        assert self._holder.stdout is not None
        try:
            line = await asyncio.wait_for(self._holder.stdout.readline(), START_TIMEOUT)
        except TimeoutError:
            line = b""
        if line.decode().strip() != HOLDER_READY:
            await self.stop(delete=False)
            raise BoxError(f"namespace box in {self.netns!r} did not start: {line!r}")

    def _layout(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for name in (*READ_ONLY, *READ_WRITE, *OWN_DIRS):
            (self.root / name).mkdir(exist_ok=True)
        for name in ("agent", "verifier", "artifacts"):  # Harbor's log directories
            (self.root / "logs" / name).mkdir(exist_ok=True)
        (self.root / "tmp").chmod(0o1777)
        for name in ("bin", "sbin", "lib", "lib64", "lib32", "libx32"):
            host = Path("/") / name
            if host.is_symlink() and not (self.root / name).is_symlink():
                (self.root / name).symlink_to(os.readlink(host))

    async def exec(
        self,
        command: str,
        *,
        cwd: str = "/",
        env: dict[str, str] | None = None,
        user: str | int | None = None,
        timeout_sec: float | None = None,
        input: bytes | None = None,
    ) -> BoxResult:
        """Run `command` with `sh -c` inside the box (its root, namespaces, `env` only, `input`
        on stdin); after `timeout_sec` the whole process group is killed and 124 returned, as
        `timeout(1)`."""
        line = f"cd {shlex.quote(cwd)} && {command}"
        argv = [
            "nsenter",
            f"--target={self.holder_pid}",
            "--mount",
            "--net",
            "--",
            "chroot",
            str(self.root),
            *SETPRIV,
            *_as_user(user),
            "--",
            "/bin/sh",
            "-c",
            line,
        ]
        base = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root",
        }
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL if input is None else asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**base, **(env or {})},
            start_new_session=True,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(input), timeout_sec)
        except (TimeoutError, asyncio.CancelledError) as exc:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            out, err = await proc.communicate()
            if isinstance(exc, asyncio.CancelledError):
                raise
            return BoxResult(out.decode(errors="replace"), err.decode(errors="replace"), 124)
        assert proc.returncode is not None
        return BoxResult(
            out.decode(errors="replace"), err.decode(errors="replace"), proc.returncode
        )

    def host_path(self, path: str) -> Path:
        """The host path of the box's absolute `path`; `BoxError` if it leaves the root
        (through `..` or a link)."""
        pure = PurePosixPath(path)
        if not pure.is_absolute():
            raise BoxError(f"box path {path!r} is not absolute")
        host = self.root.joinpath(*pure.parts[1:])
        resolved = host.resolve()
        if resolved != self.root.resolve() and self.root.resolve() not in resolved.parents:
            raise BoxError(f"box path {path!r} leaves the box")
        return host

    def upload(self, source: Path, target: str) -> None:
        dest = self.host_path(target)
        if source.is_dir():
            shutil.copytree(source, dest, symlinks=True, dirs_exist_ok=True)
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest, follow_symlinks=False)

    def download(self, source: str, target: Path) -> None:
        src = self.host_path(source)
        if src.is_dir() and not src.is_symlink():
            shutil.copytree(src, target, symlinks=True, dirs_exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target, follow_symlinks=False)

    async def stop(self, *, delete: bool = True) -> None:
        """Kill the holder (its mounts go with its mount namespace) and, with `delete`,
        remove the root."""
        holder, self._holder = self._holder, None
        if holder is not None and holder.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(holder.pid, signal.SIGKILL)
            await holder.wait()
        if delete:
            await asyncio.to_thread(shutil.rmtree, self.root, True)


def _as_user(user: str | int | None) -> list[str]:
    """setpriv's arguments to run as `user` (a name or uid of the host's, hence the box's,
    /etc/passwd; a bare uid without an entry runs with gid = uid)."""
    if user is None or user in ("root", 0, "0"):
        return []
    try:
        entry = pwd.getpwuid(int(user)) if str(user).isdigit() else pwd.getpwnam(str(user))
    except KeyError:
        if not str(user).isdigit():
            raise BoxError(f"no user {user!r} in the box's /etc/passwd") from None
        return [f"--reuid={user}", f"--regid={user}", "--clear-groups"]
    return [f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--init-groups"]


def _mount_script(root: Path) -> str:
    r = shlex.quote(str(root))
    lines = []
    for name in READ_ONLY:
        lines += [f"mount --rbind /{name} {r}/{name}", f"mount -o remount,bind,ro {r}/{name}"]
    lines += [f"mount --rbind /{name} {r}/{name}" for name in READ_WRITE]
    lines.append(f"mount -t proc proc {r}/proc")
    return "\n".join(lines) + "\n"


__all__ = ["BoxError", "BoxResult", "NamespaceBox"]

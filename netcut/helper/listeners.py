"""Listeners from the helper: sockets opened inside the container's namespace by the helper
and passed back to the host process over a unix socket (`SCM_RIGHTS`), so a process that
cannot enter the namespace (no CAP_SYS_ADMIN: a docker-group user, rootless podman) can still
listen on the sandbox's own loopback (docs/netcut.md#listeners-from-the-helper).

The host makes a private directory holding one listening unix socket and bind-mounts it into
the helper (`PASS_DIR`). The helper's interpreter (helper/image.py) runs `PROGRAM` with
`-I -S`: only built-in modules, no file of the container's is read. It binds every socket
asked for, in order, connects to the unix socket, sends one message naming the ports it bound
with all the descriptors attached, and exits; the sockets need no privilege to bind. The host
accepts that one connection, checks the sender (its peer credentials: root, as docker's helper
runs, or this user, as rootless podman's does) and every descriptor (a socket of the family,
type and address asked for, listening when it is TCP), and hands them to its event loop.

`ListenSpec`s, `spec_args` and `parse_reply` are pure; `FdPass` is the shell.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import tempfile
from dataclasses import dataclass
from typing import Literal

from netcut.errors import ApplyFailed, InvalidInput

# Where the host's directory appears in the helper.
PASS_DIR = "/netcut/pass"
SOCKET_NAME = "s"
MAX_SOCKETS = 64
MAX_REPLY = 4096
BACKLOG = 1024
# The helper connects once its program ran; a second is plenty for the message to arrive.
ACCEPT_TIMEOUT_S = 5.0

Proto = Literal["tcp", "udp"]


@dataclass(frozen=True)
class ListenSpec:
    """One socket the helper opens: `proto` on `host:port`. `fallback`: on EADDRINUSE bind
    port 0 instead (a framework route's forwarder: docs/proxy.md#listening-inside-a-namespace-
    framework-route-forwarders). `same_port`: bind the port the previous socket got (a DNS
    responder's UDP socket beside its TCP one)."""

    proto: Proto
    host: str
    port: int
    fallback: bool = False
    same_port: bool = False


# Runs in the helper as `python3 -I -S -c PROGRAM PATH SPEC...` with SPEC `proto,host,port,
# flags`. Built-in modules only (`_socket`, `sys`): the image has no standard library.
# Replies `ok PORT...` with the descriptors, or `error ERRNO INDEX` without any.
PROGRAM = r"""
import _socket as S, sys
def main(path, specs, backlog):
    socks, ports = [], []
    for i, spec in enumerate(specs):
        proto, host, port, flags = spec.split(",")
        port = ports[-1] if "s" in flags else int(port)
        fam = S.AF_INET6 if ":" in host else S.AF_INET
        s = S.socket(fam, S.SOCK_STREAM if proto == "tcp" else S.SOCK_DGRAM)
        socks.append(s)
        try:
            if proto == "tcp":
                s.setsockopt(S.SOL_SOCKET, S.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError as e:
                if "f" not in flags or e.errno != 98:
                    raise
                s.bind((host, 0))
            if proto == "tcp":
                s.listen(backlog)
        except OSError as e:
            return "error %d %d" % (e.errno or 0, i), []
        ports.append(s.getsockname()[1])
    return "ok " + " ".join(map(str, ports)), socks
text, socks = main(sys.argv[1], sys.argv[3:], int(sys.argv[2]))
fds = [s.fileno() for s in socks]
c = S.socket(S.AF_UNIX, S.SOCK_STREAM)
c.connect(sys.argv[1])
anc = [(S.SOL_SOCKET, S.SCM_RIGHTS, b"".join(f.to_bytes(4, sys.byteorder) for f in fds))]
c.sendmsg([text.encode()], anc if fds else [])
print(text)
"""


def spec_args(specs: tuple[ListenSpec, ...]) -> list[str]:
    """The program's SPEC arguments; InvalidInput for a spec it could not carry."""
    if not specs or len(specs) > MAX_SOCKETS:
        raise InvalidInput(f"between 1 and {MAX_SOCKETS} listeners, not {len(specs)}")
    out = []
    for i, spec in enumerate(specs):
        if "," in spec.host or not spec.host or not 0 <= spec.port <= 65535:
            raise InvalidInput(f"listener {spec.host!r}:{spec.port}: not an address and port")
        if spec.same_port and i == 0:
            raise InvalidInput("the first listener cannot take the previous one's port")
        flags = ("f" if spec.fallback else "") + ("s" if spec.same_port else "") or "-"
        out.append(f"{spec.proto},{spec.host},{spec.port},{flags}")
    return out


class ListenRefused(OSError):
    """The helper could not open a listener: its errno (EADDRINUSE: the port is taken inside
    the sandbox) and which one."""

    def __init__(self, err: int, spec: ListenSpec) -> None:
        why = os.strerror(err) if err else "unknown error"
        super().__init__(
            err, f"listener {spec.proto} {spec.host}:{spec.port} in the sandbox: {why}"
        )
        self.spec = spec


def parse_reply(text: bytes, specs: tuple[ListenSpec, ...], nfds: int) -> tuple[int, ...]:
    """Pure: the helper's message -> the ports bound, one per spec; ListenRefused for its
    `error` reply, ApplyFailed for anything else (a reply the program never writes)."""
    try:
        words = text.decode("ascii").split(" ")
    except UnicodeDecodeError:
        raise ApplyFailed("listeners from the helper: an unreadable reply") from None
    if len(words) == 3 and words[0] == "error" and nfds == 0:
        err, index = _number(words[1]), _number(words[2])
        if err is not None and index is not None and index < len(specs):
            raise ListenRefused(err, specs[index])
    if words[0] == "ok" and len(words) == len(specs) + 1 and nfds == len(specs):
        ports = tuple(_number(w) for w in words[1:])
        if all(p is not None and 0 < p <= 65535 for p in ports):
            return tuple(p for p in ports if p is not None)
    shown = text[:80].decode("ascii", "replace")
    raise ApplyFailed(
        f"listeners from the helper: unexpected reply {shown!r} with {nfds} descriptors"
    )


def _number(word: str) -> int | None:
    return int(word) if word.isascii() and word.isdigit() and len(word) <= 6 else None


def check_socket(sock: socket.socket, spec: ListenSpec, port: int) -> None:
    """ApplyFailed unless `sock` is what `spec` asked for, bound where the reply says."""
    family = socket.AF_INET6 if ":" in spec.host else socket.AF_INET
    kind = socket.SOCK_STREAM if spec.proto == "tcp" else socket.SOCK_DGRAM
    try:
        bound = sock.getsockname()
        ok = sock.family == family and sock.type == kind and bound[1] == port
        ok = ok and _same_host(str(bound[0]), spec.host)
        if spec.proto == "tcp":
            ok = ok and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
    except OSError:
        ok = False
    if not ok:
        raise ApplyFailed(f"listeners from the helper: descriptor for {spec} is not that socket")


def _same_host(bound: str, host: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(bound) == ipaddress.ip_address(host)
    except ValueError:
        return False


class FdPass:
    """The host's end: a private directory with one listening unix socket, mounted into the
    helper at `PASS_DIR`; `receive` takes the helper's one message and its descriptors."""

    def __init__(self) -> None:
        base = os.environ.get("XDG_RUNTIME_DIR") or None
        if base is not None and not os.path.isdir(base):
            base = None
        self.dir = tempfile.mkdtemp(prefix="netcut-pass-", dir=base)
        self.path = os.path.join(self.dir, SOCKET_NAME)
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.server.bind(self.path)
            self.server.listen(1)
            # the helper is root without CAP_DAC_OVERRIDE (docker) or this user (rootless
            # podman): it may pass the directory and connect, nobody may list it
            os.chmod(self.path, 0o666)
            os.chmod(self.dir, 0o711)
        except BaseException:
            self.close()
            raise

    def bind(self) -> str:
        """The directory's mount in the helper, as `HOST:CONTAINER`."""
        return f"{self.dir}:{PASS_DIR}"

    def mount_args(self) -> list[str]:
        """The helper's `run` arguments that mount the directory."""
        return ["-v", self.bind()]

    def command(self, specs: tuple[ListenSpec, ...], python: str) -> str:
        """The helper's shell command that opens `specs` and passes them back."""
        import shlex

        argv = [python, "-I", "-S", "-c", PROGRAM, f"{PASS_DIR}/{SOCKET_NAME}", str(BACKLOG)]
        return " ".join(shlex.quote(a) for a in [*argv, *spec_args(specs)])

    def receive(
        self, specs: tuple[ListenSpec, ...], timeout: float = ACCEPT_TIMEOUT_S
    ) -> list[socket.socket]:
        """The helper's sockets, in the order of `specs`, checked (see the module doc)."""
        ready, _, _ = select.select([self.server], [], [], timeout)
        if not ready:
            raise ApplyFailed("listeners from the helper: it never connected")
        conn, _ = self.server.accept()
        with conn:
            _check_peer(conn)
            conn.settimeout(timeout)
            try:
                text, fds, _, _ = socket.recv_fds(conn, MAX_REPLY, MAX_SOCKETS)
            except OSError as exc:
                raise ApplyFailed(f"listeners from the helper: {exc}") from None
        socks = [socket.socket(fileno=fd) for fd in fds]
        try:
            ports = parse_reply(text, specs, len(socks))
            for sock, spec, port in zip(socks, specs, ports, strict=True):
                check_socket(sock, spec, port)
                sock.setblocking(False)
        except BaseException:
            for sock in socks:
                sock.close()
            raise
        return socks

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.server.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(OSError):
            os.rmdir(self.dir)

    def __enter__(self) -> FdPass:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_peer(conn: socket.socket) -> None:
    """Only the helper may hand us sockets: root (docker's helper, the engine's root) or
    this user (rootless podman maps the helper's root to it)."""
    import struct

    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _, uid, _ = struct.unpack("3i", creds)
    if uid not in (0, os.getuid()):
        raise ApplyFailed(f"listeners from the helper: a connection from uid {uid} was refused")


__all__ = [
    "PASS_DIR",
    "PROGRAM",
    "FdPass",
    "ListenRefused",
    "ListenSpec",
    "check_socket",
    "parse_reply",
    "spec_args",
]

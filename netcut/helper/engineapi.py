"""The helper container through the Docker Engine API, without the docker CLI
(docs/netcut.md#the-docker-engine-api).

Shell, with its pure parts first. For `docker`, when its engine is a local unix socket (no
`DOCKER_HOST=tcp://...`, no docker context but the default one) that this process may
connect to, the helper run is three requests on that socket instead of a `docker run`: create
(the same options as `container.helper_argv`'s: `--network container:ID`, `--cap-drop ALL
--cap-add NET_ADMIN --cap-add NET_RAW`, /proc/sys unmasked, removed by the engine when it
exits, no log), attach (the connection is hijacked: the helper's stdin, and its stdout and
stderr multiplexed in frames) and start. That saves the CLI's process start and its wait
for the container's removal: the session ends when the helper wrote its last answer; its
stdin is closed, the helper exits at once, and the engine removes it (`AutoRemove`) while a
thread reads the connection to its end. A target's `inspect` is one GET on the same socket.

Anything else (podman, ctr, a remote engine, a socket this user may not open) keeps the CLI
(container.py), which says what is wrong in the engine's own words. `NETCUT_DOCKER_API=0`
forces the CLI. An answer the API should never give is `EngineApiError`, naming the request,
the status and the way out.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from netcut.errors import ApplyFailed

API_ENV = "NETCUT_DOCKER_API"
# The API version every docker since 20.10 (Debian's dockerd) speaks; newer engines keep it.
VERSION = "v1.41"
DEFAULT_SOCKET = "/var/run/docker.sock"
REQUEST_TIMEOUT_S = 60.0
# A helper exits as soon as its stdin closes; its stream ends when it did.
DRAIN_TIMEOUT_S = 60.0
_FRAME = struct.Struct(">BxxxL")
_MAX_FRAME = 16 << 20
_MAX_HEAD = 16384
_FALLBACK = f"set {API_ENV}=0 to run the helper through the docker CLI instead"


class EngineApiError(ApplyFailed):
    """The engine's API answered what it never should: the request, the status, the way out."""


# ---------------------------------------------------------------- pure


def api_socket(runtime: str, env: Mapping[str, str], config_text: str | None = None) -> str | None:
    """The unix socket whose API the helper may use in place of `runtime` (the docker CLI),
    or None for the CLI: another runtime, `NETCUT_DOCKER_API=0`, a non-unix `DOCKER_HOST`,
    or a docker context other than the default (in `DOCKER_CONTEXT` or as `currentContext`
    in the CLI's config.json, `config_text`), which only the CLI knows how to reach."""
    if os.path.basename(runtime) != "docker" or env.get(API_ENV, "").strip() == "0":
        return None
    if env.get("DOCKER_CONTEXT", "default") not in ("", "default"):
        return None
    host = env.get("DOCKER_HOST", "").strip()
    if not host:
        if _current_context(config_text) not in ("", "default"):
            return None
        return DEFAULT_SOCKET
    if not host.startswith("unix://") or len(host) <= len("unix://"):
        return None
    return host[len("unix://") :]


def _current_context(config_text: str | None) -> str:
    if not config_text:
        return ""
    try:
        config = json.loads(config_text)
    except ValueError:
        return "unreadable"  # the CLI will say what is wrong with it
    current = config.get("currentContext") if isinstance(config, dict) else None
    return current if isinstance(current, str) else ""


def create_body(
    target: str, image: str, caps: tuple[str, ...], binds: tuple[str, ...]
) -> dict[str, Any]:
    """The create request of a helper: what `container.helper_argv` asks of the docker CLI
    (`run -i --rm --pull never --log-driver none --network container:TARGET --cap-drop ALL
    --cap-add ... --security-opt systempaths=unconfined -v BIND --entrypoint /bin/sh`).
    Create never pulls; `systempaths=unconfined` is the CLI's name for empty masked and
    read-only path lists."""
    return {
        "Image": image,
        "Entrypoint": ["/bin/sh"],
        "Cmd": [],
        "OpenStdin": True,
        "StdinOnce": True,
        "AttachStdin": True,
        "AttachStdout": True,
        "AttachStderr": True,
        "Tty": False,
        "Labels": {"netcut.helper": target},
        "HostConfig": {
            "AutoRemove": True,
            "NetworkMode": f"container:{target}",
            "CapDrop": ["ALL"],
            "CapAdd": list(caps),
            "MaskedPaths": [],
            "ReadonlyPaths": [],
            "LogConfig": {"Type": "none", "Config": {}},
            "Binds": list(binds),
        },
    }


def split_frames(data: bytes) -> tuple[list[tuple[int, bytes]], bytes]:
    """Pure: the complete frames of an attached stream (`[stream, 0, 0, 0, size:u32be]`
    then `size` bytes; stream 1 stdout, 2 stderr) and what is left over. EngineApiError for
    a header no engine writes."""
    frames = []
    while len(data) >= _FRAME.size:
        kind, size = _FRAME.unpack_from(data)
        if kind not in (0, 1, 2) or data[1:4] != b"\0\0\0" or size > _MAX_FRAME:
            raise EngineApiError(
                f"docker engine API: the helper's stream is not multiplexed frames "
                f"(header {data[:8].hex()}); {_FALLBACK}"
            )
        if len(data) < _FRAME.size + size:
            break
        frames.append((kind, data[_FRAME.size : _FRAME.size + size]))
        data = data[_FRAME.size + size :]
    return frames, data


def message(body: bytes) -> str:
    """The engine's error text: `{"message": ...}`, else the body itself (shortened)."""
    with contextlib.suppress(ValueError, AttributeError):
        said = json.loads(body).get("message")
        if isinstance(said, str) and said.strip():
            return said.strip()
    text = body.decode(errors="replace").strip()
    return text[:300] or "no message"


# ---------------------------------------------------------------- shell


def find_socket(runtime: str) -> str | None:
    """`api_socket` for this process's environment, only if it may connect to it (else the
    CLI runs, and says why the engine refused)."""
    if api_socket(runtime, os.environ, None) is None:
        return None  # no config turns a no into a yes: not read
    config_dir = os.environ.get("DOCKER_CONFIG") or os.path.expanduser("~/.docker")
    config_text = None
    with contextlib.suppress(OSError, UnicodeDecodeError):
        with open(os.path.join(config_dir, "config.json")) as f:
            config_text = f.read()
    path = api_socket(runtime, os.environ, config_text)
    if path is None:
        return None
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        return None
    finally:
        probe.close()
    return path


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("docker", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.path)
        self.sock = sock


class Api:
    """Requests on the engine's socket: one connection each (a connect is microseconds)."""

    def __init__(self, path: str, timeout: float = REQUEST_TIMEOUT_S) -> None:
        self.path = path
        self.timeout = timeout

    def request(self, method: str, url: str, body: object = None) -> tuple[int, bytes]:
        """(status, body) of `method /VERSION{url}`; EngineApiError if the socket fails."""
        conn = _UnixConnection(self.path, self.timeout)
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        try:
            conn.request(method, f"/{VERSION}{url}", data, headers)
            response = conn.getresponse()
            return response.status, response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise EngineApiError(
                f"docker engine API at {self.path}: {method} {url}: {exc}; {_FALLBACK}"
            ) from None
        finally:
            conn.close()

    def json(self, method: str, url: str, body: object = None, ok: int = 200) -> Any:
        """The decoded answer of a request expected to answer `ok`; (status, message) of any
        other as EngineApiStatus, an undecodable answer as EngineApiError."""
        status, data = self.request(method, url, body)
        if status != ok:
            raise EngineApiStatus(status, message(data), f"{method} {url}")
        if status == 204:
            return None
        try:
            return json.loads(data)
        except ValueError:
            raise EngineApiError(
                f"docker engine API at {self.path}: {method} {url} answered {status} with "
                f"no JSON ({data[:80]!r}); {_FALLBACK}"
            ) from None

    def inspect(self, ref: str) -> dict[str, Any]:
        """`docker inspect REF` of a container; EngineApiStatus 404 when there is none."""
        info = self.json("GET", f"/containers/{quote(ref, safe='')}/json")
        if not isinstance(info, dict) or not isinstance(info.get("Id"), str):
            raise EngineApiError(
                f"docker engine API at {self.path}: container {ref!r}: inspect answered "
                f"{str(info)[:80]!r}, not a container; {_FALLBACK}"
            )
        return info


class EngineApiStatus(ApplyFailed):
    """The engine refused a request: its status and its own message (e.g. 404 `No such
    image: ...`, which container.py's `no_such_image` recognises)."""

    def __init__(self, status: int, said: str, what: str) -> None:
        super().__init__(f"{said} (docker engine API: {what} answered {status})")
        self.status = status
        self.said = said


class ApiHelper:
    """One helper container run through the API: created, attached, started; `write` to its
    stdin, `read` its output; `close` ends its stdin and leaves the rest to a thread."""

    def __init__(self, api: Api, body: dict[str, Any]) -> None:
        self.api = api
        self.err = b""  # what the helper wrote to stderr (its shell, before `exec 2>&1`)
        self.pending = b""
        self.eof = False
        created = api.json("POST", "/containers/create", body, ok=201)
        if not isinstance(created, dict) or not isinstance(created.get("Id"), str):
            raise EngineApiError(
                f"docker engine API at {api.path}: create answered {str(created)[:80]!r}, "
                f"no container id; {_FALLBACK}"
            )
        self.id: str = created["Id"]
        try:
            self.sock = self._attach()
            api.json("POST", f"/containers/{self.id}/start", ok=204)
        except BaseException:
            self._remove()
            raise

    def _attach(self) -> socket.socket:
        """The hijacked connection of `attach` (stdin, stdout, stderr, streamed)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        url = f"/{VERSION}/containers/{self.id}/attach?stream=1&stdin=1&stdout=1&stderr=1"
        request = (
            f"POST {url} HTTP/1.1\r\nHost: docker\r\nContent-Length: 0\r\n"
            "Connection: Upgrade\r\nUpgrade: tcp\r\n\r\n"
        )
        try:
            sock.settimeout(REQUEST_TIMEOUT_S)
            sock.connect(self.api.path)
            sock.sendall(request.encode())
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = sock.recv(4096)
                if not chunk or len(head) > _MAX_HEAD:
                    raise EngineApiError(
                        f"docker engine API at {self.api.path}: attach answered "
                        f"{head[:80]!r}, no stream; {_FALLBACK}"
                    )
                head += chunk
        except OSError as exc:
            sock.close()
            raise EngineApiError(
                f"docker engine API at {self.api.path}: attach: {exc}; {_FALLBACK}"
            ) from None
        except BaseException:
            sock.close()
            raise
        status_line, _, _ = head.partition(b"\r\n")
        parts = status_line.split(b" ", 2)
        if len(parts) < 2 or parts[1] not in (b"101", b"200"):
            sock.close()
            _, _, body = head.partition(b"\r\n\r\n")
            raise EngineApiError(
                f"docker engine API at {self.api.path}: attach answered "
                f"{status_line.decode(errors='replace')!r}: {message(body)}; {_FALLBACK}"
            )
        self.pending = head.partition(b"\r\n\r\n")[2]
        sock.setblocking(False)
        return sock

    def _remove(self) -> None:
        """A created helper that never started: removed, so nothing is left behind."""
        with contextlib.suppress(ApplyFailed):
            self.api.request("DELETE", f"/containers/{self.id}?force=1")

    def fileno(self) -> int:
        return self.sock.fileno()

    def write(self, data: bytes) -> None:
        """All of `data` to the helper's stdin; BrokenPipeError when it is gone."""
        view = memoryview(data)
        while view:
            _, ready, _ = select.select([], [self.sock], [], REQUEST_TIMEOUT_S)
            if not ready:
                raise BrokenPipeError(f"the helper read nothing for {REQUEST_TIMEOUT_S:g}s")
            try:
                sent = self.sock.send(view)
            except BlockingIOError:
                continue
            except OSError:
                raise BrokenPipeError("the helper's stream closed") from None
            view = view[sent:]

    def read(self, timeout: float) -> bytes | None:
        """The helper's next stdout bytes; b"" when its stream ended, None on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            frames, self.pending = split_frames(self.pending)
            out = b"".join(data for kind, data in frames if kind != 2)
            self.err += b"".join(data for kind, data in frames if kind == 2)
            if out:
                return out
            if self.eof:
                return b""
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self.sock], [], [], left)
            if not ready:
                continue
            try:
                chunk = self.sock.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                chunk = b""
            if chunk:
                self.pending += chunk
            else:
                self.eof = True

    def failure(self, timeout: float = 10.0) -> str:
        """What the helper said on stderr once its stream ended (or `timeout` passed)."""
        deadline = time.monotonic() + timeout
        while not self.eof and (left := deadline - time.monotonic()) > 0:
            if self.read(left) is None:
                break
        said = self.err.decode(errors="replace").strip()
        return said or "its output ended without a word (the helper's shell exited)"

    def close(self, wait: bool = True) -> None:
        """End the helper's stdin: its shell exits and the engine removes the container.
        `wait`: until its stream ended (the helper's process is gone); else a thread reads
        the stream to its end and closes the connection."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)
        if wait:
            self._drain()
        else:
            threading.Thread(target=self._drain, daemon=True, name="netcut-helper-drain").start()

    def _drain(self) -> None:
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        try:
            while not self.eof and (left := deadline - time.monotonic()) > 0:
                ready, _, _ = select.select([self.sock], [], [], left)
                if ready:
                    try:
                        self.eof = not self.sock.recv(65536)
                    except BlockingIOError:
                        continue
                    except OSError:
                        self.eof = True
        finally:
            with contextlib.suppress(OSError):
                self.sock.close()


__all__ = [
    "API_ENV",
    "Api",
    "ApiHelper",
    "EngineApiError",
    "EngineApiStatus",
    "api_socket",
    "create_body",
    "find_socket",
    "message",
    "split_frames",
]

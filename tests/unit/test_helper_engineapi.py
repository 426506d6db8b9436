"""The helper through the Docker Engine API (netcut/helper/engineapi.py): which engine may be
reached without the CLI, the create request, the attached stream's frames, and what an engine
answering what it never should is told (docs/netcut.md#the-docker-engine-api).

The answers come from a real unix socket served by a thread of this test: the client's whole
path (connect, HTTP, hijack, frames) runs, against an engine that misbehaves on purpose."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import tempfile
import threading
from collections.abc import Callable, Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from netcut.errors import ApplyFailed
from netcut.helper import engineapi
from netcut.helper.engineapi import (
    Api,
    ApiHelper,
    EngineApiError,
    EngineApiStatus,
    api_socket,
    create_body,
    split_frames,
)
from netcut.helper.session import CAPABILITIES, HelperExecutor, no_such_image


def frame(kind: int, data: bytes) -> bytes:
    return struct.pack(">BxxxL", kind, len(data)) + data


# ---------------------------------------------------------------- which engine


@pytest.mark.parametrize(
    ("runtime", "env", "config", "expected"),
    [
        ("docker", {}, None, "/var/run/docker.sock"),
        ("/usr/bin/docker", {"DOCKER_HOST": "unix:///run/x.sock"}, None, "/run/x.sock"),
        ("docker", {"DOCKER_HOST": "tcp://10.0.0.1:2375"}, None, None),
        ("docker", {"DOCKER_HOST": "ssh://me@host"}, None, None),
        ("docker", {"DOCKER_HOST": "unix://"}, None, None),
        ("docker", {"DOCKER_CONTEXT": "remote"}, None, None),
        ("docker", {"DOCKER_CONTEXT": "default"}, None, "/var/run/docker.sock"),
        ("docker", {}, '{"currentContext": "remote"}', None),
        ("docker", {}, '{"currentContext": "default"}', "/var/run/docker.sock"),
        ("docker", {}, "{not json", None),
        ("docker", {}, "[]", "/var/run/docker.sock"),
        # DOCKER_HOST wins over the config's context, as in the CLI
        ("docker", {"DOCKER_HOST": "unix:///s"}, '{"currentContext": "remote"}', "/s"),
        ("docker", {"NETCUT_DOCKER_API": "0"}, None, None),
        ("podman", {}, None, None),
        ("/usr/bin/ctr", {}, None, None),
    ],
)
def test_which_engine_the_api_may_reach(
    runtime: str, env: dict[str, str], config: str | None, expected: str | None
) -> None:
    assert api_socket(runtime, env, config) == expected


def test_a_socket_this_user_cannot_open_keeps_the_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    """No API where the connect fails: the CLI runs and says why in the engine's words."""
    with tempfile.TemporaryDirectory() as d:
        monkeypatch.setenv("DOCKER_HOST", f"unix://{d}/none.sock")
        assert engineapi.find_socket("docker") is None
        assert HelperExecutor("docker", "box", "img").transport == "cli"


def test_the_create_request_is_the_clis_run() -> None:
    body = create_body("abc", "img:1", CAPABILITIES, ("/tmp/p:/netcut/pass",))
    host = body["HostConfig"]
    assert body["Entrypoint"] == ["/bin/sh"]
    assert body["OpenStdin"]
    assert body["StdinOnce"]
    assert not body["Tty"]
    assert host["NetworkMode"] == "container:abc"
    assert host["CapDrop"] == ["ALL"]
    assert host["CapAdd"] == ["NET_ADMIN", "NET_RAW"]
    assert host["AutoRemove"] is True
    assert host["MaskedPaths"] == []
    assert host["ReadonlyPaths"] == []
    assert host["LogConfig"]["Type"] == "none"
    assert host["Binds"] == ["/tmp/p:/netcut/pass"]
    assert "Privileged" not in host
    assert "PidMode" not in host


# ---------------------------------------------------------------- frames


@given(st.lists(st.tuples(st.sampled_from([1, 2]), st.binary(max_size=300)), max_size=8))
def test_frames_split_at_any_boundary(frames: list[tuple[int, bytes]]) -> None:
    stream = b"".join(frame(k, d) for k, d in frames)
    for cut in {0, len(stream) // 3, len(stream) // 2, len(stream)}:
        first, rest = split_frames(stream[:cut])
        second, left = split_frames(rest + stream[cut:])
        assert left == b""
        assert first + second == frames


@given(st.binary(min_size=8, max_size=64))
def test_any_stream_is_frames_or_a_typed_error(data: bytes) -> None:
    said = ""
    try:
        frames, rest = split_frames(data)
    except EngineApiError as exc:
        said = str(exc)
        frames, rest = [], data
    assert "NETCUT_DOCKER_API=0" in said or len(rest) < len(data) or not frames


@pytest.mark.parametrize(
    "header",
    [
        b"\x03\0\0\0\0\0\0\x01",
        b"\x01\x01\0\0\0\0\0\x01",
        b"HTTP/1.1",
        b"\x01\0\0\0\xff\xff\xff\xff",
    ],
)
def test_a_header_no_engine_writes_is_refused(header: bytes) -> None:
    with pytest.raises(EngineApiError, match="not multiplexed frames"):
        split_frames(header + b"x")


# ---------------------------------------------------------------- an engine that misbehaves


Handler = Callable[[bytes], bytes]


@contextlib.contextmanager
def engine(answer: Callable[[str], bytes | None]) -> Iterator[str]:
    """A unix socket answering each request with `answer(request line)` (None: close without
    a word); every connection in a thread of its own."""
    d = tempfile.mkdtemp(prefix="nc-api-")
    path = os.path.join(d, "docker.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(8)
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                head += chunk
            line = head.split(b"\r\n", 1)[0].decode()
            body = b""
            length = [h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:")]
            want = int(length[0].split(b":")[1]) if length else 0
            body = head.partition(b"\r\n\r\n")[2]
            while len(body) < want:
                body += conn.recv(65536)
            out = answer(line)
            if out is not None:
                conn.sendall(out)
                if b"101" in out.split(b"\r\n", 1)[0]:
                    stop.wait(10)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield path
    finally:
        stop.set()
        server.close()
        os.unlink(path)
        os.rmdir(d)


def http(status: str, body: bytes = b"", extra: str = "") -> bytes:
    return (
        f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n{extra}"
        "Content-Type: application/json\r\n\r\n"
    ).encode() + body


CREATED = http("201 Created", b'{"Id": "c0ffee", "Warnings": []}')


def answers(**by_path: bytes | None) -> Callable[[str], bytes | None]:
    def answer(line: str) -> bytes | None:
        for key, out in by_path.items():
            if f"/{key.replace('_', '/')}" in line:
                return out
        return http("500 Internal Server Error", b'{"message": "unexpected"}')

    return answer


BODY = create_body("box", "img", CAPABILITIES, ())


@pytest.mark.parametrize(
    ("create", "said"),
    [
        (http("201 Created", b"<html>proxy</html>"), "no JSON"),
        (http("201 Created", b'{"Warnings": []}'), "no container id"),
        (http("201 Created", b"[1, 2]"), "no container id"),
        (None, "create"),
        (b"garbage that is no HTTP\r\n\r\n", "create"),
    ],
)
def test_a_create_answer_no_engine_gives_is_a_typed_error(create: bytes | None, said: str) -> None:
    with engine(answers(containers_create=create)) as path:
        with pytest.raises(EngineApiError, match=said) as caught:
            ApiHelper(Api(path, timeout=5), BODY)
    assert "NETCUT_DOCKER_API=0" in str(caught.value)
    assert path in str(caught.value)


def test_an_engine_refusal_keeps_its_own_words() -> None:
    """A 404 for the image is the engine's `No such image`, which the session knows how to
    handle (it imports the default image): a status, not a broken API."""
    missing = http("404 Not Found", b'{"message": "No such image: img:latest"}')
    with engine(answers(containers_create=missing)) as path:
        with pytest.raises(EngineApiStatus) as caught:
            ApiHelper(Api(path, timeout=5), BODY)
    assert caught.value.status == 404
    assert isinstance(caught.value, ApplyFailed)
    assert no_such_image(str(caught.value))


@pytest.mark.parametrize(
    ("attach", "said"),
    [
        (http("500 Internal Server Error", b'{"message": "boom"}'), "attach answered.*boom"),
        (None, "attach answered b'', no stream"),
        (http("404 Not Found", b"not json"), "attach answered.*not json"),
    ],
)
def test_an_attach_that_is_no_stream_is_a_typed_error(attach: bytes | None, said: str) -> None:
    removed: list[str] = []

    def answer(line: str) -> bytes | None:
        if "DELETE" in line:
            removed.append(line)
            return http("204 No Content")
        return answers(containers_create=CREATED, c0ffee_attach=attach)(line)

    with engine(answer) as path:
        with pytest.raises(EngineApiError, match=said) as caught:
            ApiHelper(Api(path, timeout=5), BODY)
    assert "NETCUT_DOCKER_API=0" in str(caught.value)
    assert len(removed) == 1
    assert "/containers/c0ffee?force=1" in removed[0]


def test_a_stream_of_garbage_is_a_typed_error_not_a_hang() -> None:
    upgraded = (
        b"HTTP/1.1 101 UPGRADED\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n"
        b"this is not a multiplexed stream"
    )
    answer = answers(
        containers_create=CREATED,
        c0ffee_attach=upgraded,
        c0ffee_start=http("204 No Content"),
    )
    with engine(answer) as path:
        helper = ApiHelper(Api(path, timeout=5), BODY)
        try:
            with pytest.raises(EngineApiError, match="not multiplexed frames"):
                helper.read(5.0)
        finally:
            helper.close(wait=False)


def test_an_inspect_that_is_no_container_is_a_typed_error() -> None:
    with engine(answers(box_json=http("200 OK", json.dumps({"Name": "x"}).encode()))) as path:
        with pytest.raises(EngineApiError, match="not a container"):
            Api(path, timeout=5).inspect("box")

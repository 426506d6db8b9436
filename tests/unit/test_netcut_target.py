"""Target references (netcut.targetref, shared with egress) and runtime choice (target.py)."""

from __future__ import annotations

import os
import pathlib
import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st

from netcut import resolve as target
from netcut.errors import InvalidInput, TargetNotFound
from netcut.targetref import TargetRef, canonical, default_client_id, parse_target


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("sandbox", TargetRef("netns", "sandbox")),
        ("netns:1234", TargetRef("netns", "1234")),
        ("netns:a:b", TargetRef("netns", "a:b")),
        ("a:b", TargetRef("netns", "a:b")),
        ("/proc/42/ns/net", TargetRef("path", "/proc/42/ns/net")),
        ("/run/netns/x", TargetRef("path", "/run/netns/x")),
        (42, TargetRef("pid", "42")),
        ("42", TargetRef("pid", "42")),
        ("pid:42", TargetRef("pid", "42")),
        ("pid:0042", TargetRef("pid", "42")),
        ("container:abc", TargetRef("container", "abc")),
        ("docker:abc", TargetRef("container", "abc", "docker")),
        ("podman:abc", TargetRef("container", "abc", "podman")),
        ("containerd:abc", TargetRef("container", "abc", "containerd")),
        ("containerd:default/abc", TargetRef("container", "abc", "containerd", "default")),
        (TargetRef("pid", "7"), TargetRef("pid", "7")),
    ],
    ids=[
        "name",
        "netns-prefix-digits",
        "netns-prefix-colon",
        "unknown-prefix-is-a-name",
        "proc-path",
        "run-path",
        "int",
        "digits",
        "pid-prefix",
        "pid-leading-zeros",
        "container",
        "docker",
        "podman",
        "containerd",
        "containerd-namespace",
        "ref",
    ],
)
def test_parse_target(value: str | int | TargetRef, expected: TargetRef) -> None:
    assert parse_target(value) == expected
    assert target.as_ref(value) == expected


def test_bare_digits_are_marked_bare() -> None:
    assert parse_target("42").bare
    assert not parse_target(42).bare
    assert not parse_target("pid:42").bare


@pytest.mark.parametrize(
    "value",
    [
        "",
        0,
        -1,
        True,
        "pid:",
        "pid:x",
        "pid:0",
        "netns:",
        "netns:a/b",
        "container:",
        "docker:-rm",
        "containerd:/abc",
        "containerd:ns/",
        "a/b",
        "..",
        "pid:٣",
        1.5,
        None,
        "docker:a b",
    ],
    ids=[
        "empty",
        "zero",
        "negative",
        "bool",
        "pid-empty",
        "pid-text",
        "pid-zero",
        "netns-empty",
        "netns-slash",
        "container-empty",
        "option-like",
        "ctr-empty-ns",
        "ctr-empty-id",
        "relative-path",
        "dotdot",
        "non-ascii-digit",
        "float",
        "none",
        "space-in-id",
    ],
)
def test_parse_target_rejects(value: object) -> None:
    with pytest.raises(InvalidInput):
        parse_target(value)  # type: ignore[arg-type]


@given(st.one_of(st.text(max_size=40), st.integers()))
def test_parse_target_parses_or_raises_invalid_input(value: str | int) -> None:
    try:
        ref = parse_target(value)
    except InvalidInput:
        return
    assert ref.kind in ("netns", "path", "pid", "container")
    assert ref.value
    if ref.kind == "pid":
        assert int(ref.value) > 0


@pytest.mark.parametrize(
    ("value", "inode", "expected"),
    [
        ("sbx", None, "sbx"),
        ("/run/netns/sbx", None, "sbx"),
        ("/proc/42/ns/net", 4026532000, "pid-42"),
        (42, None, "pid-42"),
        ("docker:0123456789abcdef", None, "docker-0123456789ab"),
        ("/var/run/sandboxes/net", 4026532001, "netns-4026532001"),
    ],
    ids=["name", "run-path", "proc-path", "pid", "container", "other-path"],
)
def test_default_client_ids_tell_sandboxes_apart(
    value: str | int, inode: int | None, expected: str
) -> None:
    assert default_client_id(parse_target(value), inode) == expected


@pytest.mark.parametrize(
    ("make", "arg"),
    [
        (target.netns, "a/b"),
        (target.netns, ""),
        (target.netns, ".."),
        (target.netns_path, "relative"),
        (target.pid, "0"),
        (target.pid, "x"),
        (target.container, "-rm"),
    ],
    ids=["slash", "empty", "dotdot", "relative", "pid0", "pid-text", "option-like"],
)
def test_bad_refs(make: object, arg: str) -> None:
    with pytest.raises(InvalidInput):
        make(arg)  # type: ignore[operator]


def test_bad_runtime() -> None:
    with pytest.raises(InvalidInput, match="--runtime"):
        target.container("abc", "lxc")


@pytest.mark.parametrize(
    ("flag", "env", "expected"),
    [
        ("podman", {"NETCUT_CONTAINER_RUNTIME": "docker"}, ["podman"]),
        (None, {"NETCUT_CONTAINER_RUNTIME": "podman"}, ["podman"]),
        (None, {"NETCUT_CONTAINER_RUNTIME": " "}, ["docker", "podman", "containerd"]),
        (None, {}, ["docker", "podman", "containerd"]),
    ],
    ids=["flag-wins", "env", "blank-env", "default"],
)
def test_runtime_order(flag: str | None, env: dict[str, str], expected: list[str]) -> None:
    assert target.runtime_candidates(flag, env) == expected


def test_helper_runtimes_exclude_containerd() -> None:
    assert target.runtime_candidates(None, {}, target.HELPER_RUNTIMES) == [
        "docker",
        "podman",
        "containerd",
    ]


def test_missing_runtime_names_what_was_tried(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("NETCUT_CONTAINER_RUNTIME", raising=False)
    with pytest.raises(TargetNotFound, match="docker: not on PATH; podman: not on PATH"):
        target.find_runtime(None)


def private_podman(root: pathlib.Path) -> dict[str, str]:
    """Environment for a podman that keeps everything under `root`: its storage, runtime
    state, temporary files, events and networks (CNI, whose configuration directory it
    reads instead of /etc/containers/networks)."""
    root.mkdir()
    (root / "containers.conf").write_text(
        "[network]\n"
        'network_backend = "cni"\n'
        f'network_config_dir = "{root}/cni"\n'
        "[engine]\n"
        f'tmp_dir = "{root}/tmp"\n'
        'events_logger = "file"\n'
        f'events_logfile_path = "{root}/events.log"\n'
    )
    (root / "storage.conf").write_text(
        f'[storage]\ndriver = "vfs"\ngraphroot = "{root}/graph"\nrunroot = "{root}/run"\n'
    )
    (root / "registries.conf").write_text("unqualified-search-registries = []\n")
    return {
        "CONTAINERS_CONF": str(root / "containers.conf"),
        "CONTAINERS_STORAGE_CONF": str(root / "storage.conf"),
        "CONTAINERS_REGISTRIES_CONF": str(root / "registries.conf"),
    }


def _path_with(tmp_path: pathlib.Path, *names: str) -> str:
    for name in names:
        os.symlink(f"/usr/bin/{name}", tmp_path / name)
    return str(tmp_path)


def test_a_runtime_slow_to_answer_is_still_chosen(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CLI that takes 4 s to answer (a busy machine: CI runs saw Docker CE's client and a
    podman setting up its store take over 3 s) is an engine that answers, not one passed
    over."""
    slow = tmp_path / "docker"
    slow.write_text("#!/bin/sh\n/bin/sleep 4\necho 20.10.24\n")
    slow.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("NETCUT_CONTAINER_RUNTIME", raising=False)
    assert target.choose_runtime() == ("docker", str(slow))


@pytest.mark.skipif(not os.path.exists("/usr/bin/docker"), reason="docker CLI not installed")
def test_a_docker_cli_without_an_engine_is_passed_over(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real docker CLI, pointed at a socket no daemon listens on, is not chosen."""
    monkeypatch.setenv("PATH", _path_with(tmp_path, "docker"))
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-daemon.sock")
    monkeypatch.delenv("NETCUT_CONTAINER_RUNTIME", raising=False)
    with pytest.raises(TargetNotFound, match=r"docker: Cannot connect .*; podman: not on PATH"):
        target.choose_runtime()
    monkeypatch.setenv("NETCUT_CONTAINER_RUNTIME", "docker")  # explicit: used as told
    assert target.choose_runtime() == ("docker", str(tmp_path / "docker"))


@pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists("/usr/bin/podman"), reason="root podman needed"
)
def test_with_docker_silent_podman_is_chosen(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real podman answers `podman info`, with a configuration of its own under tmp_path:
    with the machine's default one it created podman's store under /var/lib/containers and
    /etc/containers/networks (docs/netcut.md#engines-in-ci)."""
    monkeypatch.setenv("PATH", _path_with(tmp_path, "docker", "podman"))
    for name, value in private_podman(tmp_path / "podman-state").items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-daemon.sock")
    monkeypatch.delenv("NETCUT_CONTAINER_RUNTIME", raising=False)
    # a podman whose store is new sets it up at its first command, which took more than the
    # 3 s a runtime has to answer on a loaded machine (a fresh-clone CI run): a user's podman
    # has its store from the container it made, so this one's is made first
    subprocess.run(["podman", "info"], capture_output=True, timeout=120, check=True)
    assert target.choose_runtime() == ("podman", str(tmp_path / "podman"))
    assert (tmp_path / "podman-state" / "graph" / "libpod").is_dir(), "podman's store is ours"


def test_ctr_task_list() -> None:
    text = "TASK     PID      STATUS\nweb      4242     RUNNING\nold      0        STOPPED\nbad\n"
    assert target.parse_ctr_tasks(text) == {"web": (4242, "RUNNING"), "old": (0, "STOPPED")}


def test_missing_namespace_names_the_path() -> None:
    with pytest.raises(TargetNotFound, match="/run/netns/ncnope-unit"):
        target.resolve_target(target.netns("ncnope-unit"))


def test_parse_nameservers() -> None:
    text = "# c\nnameserver 127.0.0.11\noptions ndots:0\nnameserver  10.0.0.1 \nnameserver\n"
    assert target.parse_nameservers(text) == ("127.0.0.11", "10.0.0.1")


@given(st.one_of(st.text(max_size=40), st.integers()))
def test_canonical_reads_back_as_the_same_target(value: str | int) -> None:
    try:
        ref = parse_target(value)
    except InvalidInput:
        return
    assert parse_target(canonical(ref)) == ref


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1234, "pid:1234"),
        ("1234", "pid:1234"),
        ("pid:1234", "pid:1234"),
        ("sbx", "sbx"),
        ("netns:1234", "netns:1234"),
        ("netns:pid:1", "netns:pid:1"),
        ("docker:abc", "docker:abc"),
        ("containerd:k8s.io/abc", "containerd:k8s.io/abc"),
        ("/proc/1/ns/net", "/proc/1/ns/net"),
    ],
    ids=[
        "int",
        "digits",
        "pid",
        "name",
        "digit-name",
        "prefix-like-name",
        "docker",
        "containerd",
        "path",
    ],
)
def test_canonical_spelling(value: str | int, expected: str) -> None:
    assert canonical(parse_target(value)) == expected

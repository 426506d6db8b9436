"""Target references and runtime choice (pure parts of netcut.target)."""

from __future__ import annotations

import pytest

from netcut import target
from netcut.errors import InvalidInput, TargetNotFound


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("sandbox", target.TargetRef("netns", "sandbox")),
        ("/proc/42/ns/net", target.TargetRef("path", "/proc/42/ns/net")),
        (42, target.TargetRef("pid", "42")),
    ],
    ids=["name", "path", "pid"],
)
def test_as_ref(value: str | int, expected: target.TargetRef) -> None:
    assert target.as_ref(value) == expected


@pytest.mark.parametrize(
    ("make", "arg"),
    [(target.netns, "a/b"), (target.netns, ""), (target.netns, ".."),
     (target.netns_path, "relative"), (target.pid, "0"), (target.pid, "x"),
     (target.container, "-rm")],
    ids=["slash", "empty", "dotdot", "relative", "pid0", "pid-text", "option-like"],
)  # fmt: skip
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
        (None, {"NETCUT_CONTAINER_RUNTIME": " "}, ["docker", "podman"]),
        (None, {}, ["docker", "podman"]),
    ],
    ids=["flag-wins", "env", "blank-env", "default"],
)
def test_runtime_order(flag: str | None, env: dict[str, str], expected: list[str]) -> None:
    assert target.runtime_candidates(flag, env) == expected


def test_missing_runtime_names_what_was_tried(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("NETCUT_CONTAINER_RUNTIME", raising=False)
    with pytest.raises(TargetNotFound, match="tried docker, podman"):
        target.find_runtime(None)


def test_missing_namespace_names_the_path() -> None:
    with pytest.raises(TargetNotFound, match="/run/netns/ncnope-unit"):
        target.resolve_target(target.netns("ncnope-unit"))


def test_parse_nameservers() -> None:
    text = "# c\nnameserver 127.0.0.11\noptions ndots:0\nnameserver  10.0.0.1 \nnameserver\n"
    assert target.parse_nameservers(text) == ("127.0.0.11", "10.0.0.1")

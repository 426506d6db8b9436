"""What the agent in a container reaches, for the end-to-end trials of issue 30
(test_unprivileged_engines.py; test_harbor_as_user.py has its own, for Harbor's task image):
one script for the test image's busybox that says, one `KEY=ANSWER rc=STATUS` line each,
which resolvers the container has (its resolv.conf), what each answers for a name, and
what another container's port answers. The drivers (asuser_*.py) report what their process
is with `identity()`.

Resolvers are asked only when the caller says so: a container on Docker's default bridge
has the host's own resolvers, which the tests never ask while the network is open (no
traffic leaves the machine); once cut, asking them must get no answer at all, refused in
the container before it leaves.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator, Sequence

PEER_PORT = 7000
PEER_SAYS = "peer-says-hi"
PEER = f"while true; do echo {PEER_SAYS} | nc -l -p {PEER_PORT}; done"
NO_CAPS = "0000000000000000"
# what busybox nslookup says when nothing answered (no route, refused, timed out): never an
# answer, and never the NXDOMAIN ("server can't find") of a resolver that was reached
NO_ANSWER = ("no servers could be reached", "can't connect to remote host", "Connection refused")

_SHELL = """set -f
say() { out=$("$@" 2>&1); rc=$?; echo "$(echo $out) rc=$rc"; }
dns() { say busybox timeout 15 busybox nslookup "$1" "$2"; }
tcp() { say sh -c "echo hi | busybox timeout 10 busybox nc $1 $2"; }
resolvers=$(busybox sed -n 's/^nameserver[[:space:]]*//p' /etc/resolv.conf)
echo "resolvers=$(echo $resolvers)"
"""


def script(
    name: str, peer: str, *, ask: bool, extra: Sequence[str] = (), port: int = PEER_PORT
) -> str:
    """The probe: the container's resolvers; with `ask`, `name` asked of each of them and of
    `extra` resolvers (`dns_ADDR=`); the peer at `peer`:`port` (`peer=`)."""
    body = _SHELL
    if ask:
        every = " ".join(["$resolvers", *extra])
        body += f'for ns in {every}; do echo "dns_$ns=$(dns {name} $ns)"; done\n'
    return body + f'echo "peer=$(tcp {peer} {port})"\n'


def lines(text: str) -> dict[str, str]:
    """The probe's `KEY=VALUE` lines."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def resolvers(said: dict[str, str]) -> list[str]:
    """The container's resolvers, as its resolv.conf lists them."""
    return said["resolvers"].split()


def assert_cut(said: dict[str, str], address: str | None = None) -> None:
    """Nothing answered: no resolver (whichever, `address` in no answer) and not the peer."""
    asked = [k.removeprefix("dns_") for k in said if k.startswith("dns_")]
    assert asked, said  # the container has a resolver, and each was asked
    assert set(resolvers(said)) <= set(asked), said
    for resolver in asked:
        answer = said[f"dns_{resolver}"]
        assert any(said in answer for said in NO_ANSWER), (resolver, answer)
        assert "can't find" not in answer, (resolver, answer)
        assert not answer.endswith(" rc=0"), (resolver, answer)
        if address is not None:
            assert address not in answer, (resolver, answer)
    assert PEER_SAYS not in said["peer"], said


def assert_open(said: dict[str, str], address: str | None = None) -> None:
    """The peer answers; when resolvers were asked, each answers `address` for the name."""
    for resolver in resolvers(said):
        key = f"dns_{resolver}"
        if key in said:
            assert said[key].endswith(" rc=0"), (resolver, said[key])
            assert address is not None, said
            assert address in said[key], (resolver, said[key])
    assert said["peer"] == f"{PEER_SAYS} rc=0", said


@contextlib.contextmanager
def peer_container(
    engine: Sequence[str], name: str, image: str, options: Sequence[str] = ()
) -> Iterator[str]:
    """Another container (`engine`: the command that runs the engine, e.g. a user's
    `podman`) answering `PEER_SAYS` on `PEER_PORT`: its address, removed afterwards."""
    run = [*engine, "run", "-d", "--name", name, "--cap-drop", "ALL", *options, image]
    subprocess.run([*run, "sh", "-c", PEER], check=True, capture_output=True, timeout=120)
    try:
        fmt = "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}"
        inspect = [*engine, "inspect", "--format", fmt, name]
        yield subprocess.run(inspect, check=True, capture_output=True, text=True).stdout.strip()
    finally:
        kill = [*engine, "rm", "-f", *(["-t", "0"] if "podman" in engine[-1] else []), name]
        subprocess.run(kill, check=False, capture_output=True, timeout=120)


def identity() -> dict[str, object]:
    """This process as the kernel sees it: real and effective ids, groups, capability sets."""
    with open("/proc/self/status") as f:
        status = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
    return {
        "uid": os.getuid(),
        "euid": os.geteuid(),
        "gid": os.getgid(),
        "groups": sorted(os.getgroups()),
        **{k: status[k].strip() for k in ("CapEff", "CapPrm", "CapAmb")},
    }


def assert_unprivileged(seen: dict[str, object], uid: int, group_gid: int | None) -> None:
    """`identity()` of a process of user `uid`: no root id, no capability, and (`group_gid`)
    in the docker socket's group."""
    assert seen["uid"] == seen["euid"] == uid, seen
    groups = seen["groups"]
    assert isinstance(groups, list), seen
    assert 0 not in groups, seen
    if group_gid is not None:
        assert group_gid in groups, seen
    assert seen["CapEff"] == seen["CapPrm"] == seen["CapAmb"] == NO_CAPS, seen

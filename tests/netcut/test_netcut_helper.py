"""Helper-container mode against a fake runtime, and (only with a real engine) real Docker.

The fake `docker` on PATH records its argv, answers `inspect` from a table, "builds" images
into a directory, and runs a helper's script with `ip netns exec` in the test namespace that
stands for the container: the rendered commands really run against a real namespace. A fake
`nc` (busybox's, in the real image) connects from inside that namespace for the probe.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
from dataclasses import dataclass

import pytest
from netcut_testlib import Topology, wait_for

from netcut import helper, target
from netcut.cli import main

pytestmark = pytest.mark.netns

FAKE_RUNTIME = """\
#!{python}
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_RUNTIME_LOG"], "a") as f:
    f.write(json.dumps(args) + "\\n")
with open(os.environ["FAKE_RUNTIME_CONTAINERS"]) as f:
    containers = json.load(f)
images = os.environ["FAKE_RUNTIME_IMAGES"]
def image_file(tag):
    return os.path.join(images, tag.replace("/", "_").replace(":", "_"))
if args[0] == "inspect":
    info = containers.get(args[-1])
    if info is None:
        print(f"Error: No such object: {{args[-1]}}", file=sys.stderr)
        sys.exit(1)
    fmt = args[args.index("--format") + 1]
    print(info["State"]["Pid"] if fmt == "{{{{.State.Pid}}}}" else json.dumps(info))
elif args[0] == "version":  # runtime detection asks the engine (netcut/target.py)
    print("fake")
elif args[:2] == ["image", "inspect"]:
    sys.exit(0 if os.path.exists(image_file(args[2])) else 1)
elif args[0] == "build":
    with open(image_file(args[args.index("-t") + 1]), "w") as f:
        f.write(sys.stdin.read())
elif args[0] == "run":
    cid = args[args.index("--network") + 1].split(":", 1)[1]
    ns = next(c["_netns"] for c in containers.values() if c["Id"] == cid)
    os.execvp("ip", ["ip", "netns", "exec", ns, "sh", "-c", args[-1]])
else:
    sys.exit(f"fake runtime: unsupported {{args}}")
"""

FAKE_NC = """\
#!{python}
import socket, sys
args = sys.argv[1:]
timeout = float(args[args.index("-w") + 1])
addr, port = args[-2], int(args[-1])
try:
    socket.create_connection((addr, port), timeout=timeout).close()
except OSError:
    sys.exit(1)
"""


@dataclass
class FakeRuntime:
    bin: pathlib.Path
    log: pathlib.Path
    images: pathlib.Path
    containers: pathlib.Path

    def calls(self) -> list[list[str]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def add(self, name: str, netns: str, cap_drop: tuple[str, ...] = ("ALL",)) -> str:
        table = json.loads(self.containers.read_text())
        cid = (name.encode().hex() * 8)[:64]
        table[name] = table[cid] = {
            "Id": cid,
            "State": {"Pid": os.getpid(), "Running": True},
            "HostConfig": {"CapDrop": list(cap_drop), "CapAdd": None, "Privileged": False},
            "_netns": netns,
        }
        self.containers.write_text(json.dumps(table))
        return cid


@pytest.fixture
def fake_runtime(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> FakeRuntime:
    fake = FakeRuntime(tmp_path / "bin", tmp_path / "argv.log", tmp_path / "images",
                       tmp_path / "containers.json")  # fmt: skip
    fake.bin.mkdir()
    fake.images.mkdir()
    fake.containers.write_text("{}")
    for name, source in (("docker", FAKE_RUNTIME), ("nc", FAKE_NC)):
        path = fake.bin / name
        path.write_text(source.format(python=sys.executable))
        path.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.bin}:{os.environ['PATH']}")
    monkeypatch.delenv("NETCUT_CONTAINER_RUNTIME", raising=False)
    monkeypatch.delenv(helper.IMAGE_ENV, raising=False)
    for key, value in (("LOG", fake.log), ("IMAGES", fake.images),
                       ("CONTAINERS", fake.containers)):  # fmt: skip
        monkeypatch.setenv(f"FAKE_RUNTIME_{key}", str(value))
    return fake


def runs(fake: FakeRuntime) -> list[list[str]]:
    return [c for c in fake.calls() if c[0] == "run"]


def test_helper_argv_shares_only_the_network_and_holds_only_net_admin(
    topo: Topology, fake_runtime: FakeRuntime
) -> None:
    cid = fake_runtime.add("sandbox", topo.sandbox)
    result = helper.cut(target.container("sandbox"), [topo.proxy])
    assert result.changed
    assert result.probe is not None
    assert result.probe.ok
    for argv in runs(fake_runtime):
        assert argv[:4] == ["run", "--rm", "--network", f"container:{cid}"]
        caps = [argv[i + 1] for i, a in enumerate(argv) if a in ("--cap-add", "--cap-drop")]
        assert caps == ["ALL", "NET_ADMIN"], "drop everything, add NET_ADMIN only"
        assert "--privileged" not in argv
        assert argv[argv.index("--entrypoint") + 1] == "/bin/sh"
        assert argv[-3] == helper.default_image()
        assert argv[-2] == "-c"
    assert len(runs(fake_runtime)) == 3, "state dump, apply, probe"


def test_helper_cut_restore_cycle_in_a_real_namespace(
    topo: Topology, fake_runtime: FakeRuntime
) -> None:
    fake_runtime.add("sandbox", topo.sandbox)
    ref = target.container("sandbox")
    routes = topo.routes()
    assert helper.status(ref).state == "not cut"

    helper.cut(ref, [topo.proxy], expect_blocked=[f"{topo.upstream_ip}:{topo.echo_port}"])

    assert topo.reaches(topo.gateway, topo.proxy_port)
    assert not topo.reaches(topo.upstream_ip, topo.echo_port)
    assert not topo.reaches(topo.peer_ip, topo.echo_port)
    assert not topo.reaches(topo.peer_v6, topo.echo_port)
    assert not topo.udp_reaches(topo.gateway, 53)
    assert helper.status(ref).is_cut
    again = helper.cut(ref, [topo.proxy])
    assert not again.changed

    restored = helper.restore(ref)
    assert restored.changed
    assert wait_for(lambda: topo.routes() == routes), (routes, topo.routes())
    assert topo.reaches(topo.upstream_ip, topo.echo_port)
    assert not helper.restore(ref).changed


def test_image_built_once_from_inline_dockerfile_and_cached_by_hash(
    topo: Topology, fake_runtime: FakeRuntime
) -> None:
    fake_runtime.add("sandbox", topo.sandbox)
    ref = target.container("sandbox")
    helper.status(ref)
    helper.status(ref)
    builds = [c for c in fake_runtime.calls() if c[0] == "build"]
    assert builds == [["build", "-t", helper.default_image(), "-"]]
    built = fake_runtime.images / helper.default_image().replace(":", "_")
    assert built.read_text() == helper.DOCKERFILE
    assert helper.default_image().endswith(
        __import__("hashlib").sha256(helper.DOCKERFILE.encode()).hexdigest()[:12]
    )


def test_image_named_by_flag_or_env_is_not_built(
    topo: Topology, fake_runtime: FakeRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_runtime.add("sandbox", topo.sandbox)
    helper.status(target.container("sandbox"), image="example/helper:1")
    monkeypatch.setenv(helper.IMAGE_ENV, "example/helper:2")
    helper.status(target.container("sandbox"))
    used = [c[-3] for c in runs(fake_runtime)]
    assert used == ["example/helper:1", "example/helper:2"]
    assert not [c for c in fake_runtime.calls() if c[0] in ("build", "image")]


def test_dry_run_prints_the_helper_script(
    topo: Topology, fake_runtime: FakeRuntime, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_runtime.add("sandbox", topo.sandbox)
    routes = topo.routes()
    code = main(["cut", "--container", "sandbox", "--mode", "helper", "--keep", topo.proxy,
                 "--dry-run"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert "helper script:" in out
    assert f"ip -4 route add {topo.gateway}/32 dev eth0 table 254 proto 110" in out
    assert "iptables-legacy -w -N NETCUT" in out
    assert "echo 1 > /proc/sys/net/ipv6/conf/eth0/disable_ipv6" in out
    assert len(runs(fake_runtime)) == 1, "only the state dump ran"
    assert topo.routes() == routes


def test_container_keeping_net_raw_is_refused(
    topo: Topology, fake_runtime: FakeRuntime, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_runtime.add("raw", topo.sandbox, cap_drop=())
    assert main(["cut", "--container", "raw", "--mode", "helper"]) == 2
    assert "CAP_NET_RAW" in capsys.readouterr().err
    assert not runs(fake_runtime)


def test_direct_mode_resolves_a_container_pid_with_the_runtime(
    fake_runtime: FakeRuntime,
) -> None:
    fake_runtime.add("self", "unused")
    resolved = target.resolve_target(target.container("self"))
    assert resolved.pid == os.getpid()
    assert resolved.path == f"/proc/{os.getpid()}/ns/net"
    assert fake_runtime.calls()[-1][:3] == ["inspect", "--format", "{{.State.Pid}}"]


def test_missing_container_and_missing_runtime_are_clear_errors(
    fake_runtime: FakeRuntime, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status", "--container", "ghost"]) == 2
    assert "No such object: ghost" in capsys.readouterr().err
    assert main(["cut", "--container", "ghost", "--runtime", "podman", "--mode", "helper"]) == 2
    assert "tried podman" in capsys.readouterr().err
    monkeypatch.setenv("NETCUT_CONTAINER_RUNTIME", "nerdctl")
    assert main(["status", "--container", "ghost"]) == 2
    assert "tried nerdctl" in capsys.readouterr().err


def _docker_engine() -> str | None:
    """Why the real-Docker test cannot run, or None when it can."""
    if shutil.which("docker") is None:
        return "no docker CLI on PATH"
    done = subprocess.run(["docker", "info"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return f"`docker info` failed (no engine on this machine): {done.stderr.strip()[:120]}"
    return None


def _sh_in(name: str, script: str) -> str:
    done = subprocess.run(["docker", "exec", name, "sh", "-c", script],
                          capture_output=True, text=True, check=False)  # fmt: skip
    return done.stdout


@pytest.mark.docker
def test_real_docker_end_to_end() -> None:
    """Two containers on the default bridge: after a helper cut the sandbox has no default
    route and cannot reach its peer; restore brings both back. No traffic leaves the machine."""
    why = _docker_engine()
    if why is not None:
        pytest.skip(why)  # the only allowed skip: there is no container engine here
    box, peer = f"nc-e2e-s{os.getpid()}", f"nc-e2e-p{os.getpid()}"
    for name, cmd in ((box, "sleep 300"), (peer, "nc -lk -p 7000 -e cat")):
        argv = ["docker", "run", "-d", "--rm", "--name", name, "--cap-drop", "ALL",
                "alpine:3.20", "sh", "-c", cmd]  # fmt: skip
        subprocess.run(argv, check=True, capture_output=True)
    try:
        peer_ip = subprocess.run(
            ["docker", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
             peer], capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
        probe = f"nc -z -w 2 {peer_ip} 7000 && echo open"
        assert "open" in _sh_in(box, probe)
        ref = target.container(box)
        assert helper.cut(ref, [], probe=False).changed
        assert helper.status(ref).is_cut
        assert "default" not in _sh_in(box, "ip route")
        assert "open" not in _sh_in(box, probe)
        assert helper.restore(ref).changed
        assert "default" in _sh_in(box, "ip route")
        assert "open" in _sh_in(box, probe)
    finally:
        subprocess.run(["docker", "rm", "-f", box, peer], capture_output=True, check=False)

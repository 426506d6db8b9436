"""Helper-container mode against a fake runtime (real engines: tests/engines/).

The fake `docker` on PATH records its argv, answers `inspect` from a table, "imports" images
into a directory, and runs the helper's shell (bash, as in the default image) with
`ip netns exec` in the test namespace that stands for the container, feeding it the session
on stdin: the rendered commands really run against a real namespace, with the host's tools.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys
import tarfile
from dataclasses import dataclass

import pytest
from netcut_testlib import Topology, wait_for

from netcut import resolve as target
from netcut.api import DirectExecutor
from netcut.cli import main
from netcut.errors import ApplyFailed
from netcut.helper import mode as helper
from netcut.plan.model import NamespaceState

pytestmark = pytest.mark.netns

# What each client prints for `run --pull never` of an image that is not there: Docker CE's
# current client (first on PATH on these machines), Debian's docker.io 20.10, podman.
NO_IMAGE = {
    "docker 28": "docker: Error response from daemon: No such image: {image}\n\n"
    "Run 'docker run --help' for more information\n",
    "docker 20.10": "docker: Error response from daemon: No such image: {image}.\n"
    "See 'docker run --help'.\n",
    "podman": "Error: {image}: image not known\n",
}

FAKE_RUNTIME = """\
#!{python}
import json, os, sys
NO_IMAGE = {no_image!r}
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
elif args[0] == "import":
    with open(image_file(args[-1]), "wb") as f:
        f.write(sys.stdin.buffer.read())
elif args[0] == "version":  # runtime detection asks the engine (netcut/resolve.py)
    print("fake")
elif args[0] == "run":
    ns = containers[args[args.index("--network") + 1].split(":", 1)[1]]["_netns"]
    image = args[-1]
    if image.startswith("netcut-helper:") and not os.path.exists(image_file(image)):
        sys.stderr.write(os.environ.get("FAKE_RUNTIME_NO_IMAGE", NO_IMAGE["docker 28"]).format(
            image=image))
        sys.exit(125)
    shell = os.environ.get("FAKE_RUNTIME_SHELL", "bash").split()
    os.execvp("ip", ["ip", "netns", "exec", ns, *shell])
else:
    sys.exit(f"fake runtime: unsupported {{args}}")
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

    def add(self, name: str, netns: str, cap_drop: tuple[str, ...] = ("ALL",), pid: int = 0) -> str:
        table = json.loads(self.containers.read_text())
        cid = (name.encode().hex() * 8)[:64]
        table[name] = table[cid] = {
            "Id": cid,
            "State": {"Pid": pid or os.getpid(), "Running": True},
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
    path = fake.bin / "docker"
    path.write_text(FAKE_RUNTIME.format(python=sys.executable, no_image=NO_IMAGE))
    path.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.bin}:{os.environ['PATH']}")
    monkeypatch.delenv("NETCUT_CONTAINER_RUNTIME", raising=False)
    monkeypatch.delenv(helper.IMAGE_ENV, raising=False)
    # this fake is a docker *CLI*: with a docker socket at hand (DOCKER_HOST of a CI engine
    # run, or /var/run/docker.sock) netcut would talk to that engine's API instead, which
    # does not know the fake's containers (docs/netcut.md#the-docker-engine-api)
    monkeypatch.setenv("NETCUT_DOCKER_API", "0")
    for key, value in (("LOG", fake.log), ("IMAGES", fake.images),
                       ("CONTAINERS", fake.containers)):  # fmt: skip
        monkeypatch.setenv(f"FAKE_RUNTIME_{key}", str(value))
    return fake


def runs(fake: FakeRuntime) -> list[list[str]]:
    return [c for c in fake.calls() if c[0] == "run"]


def test_one_helper_run_per_cut_sharing_only_the_network(
    topo: Topology, fake_runtime: FakeRuntime
) -> None:
    cid = fake_runtime.add("sandbox", topo.sandbox)
    result = helper.cut(target.container("sandbox"), [topo.proxy])
    assert result.changed
    assert result.probe is not None
    assert result.probe.ok
    (argv,) = [c for c in runs(fake_runtime) if "No such image" not in str(c)][-1:]
    assert argv[:3] == ["run", "-i", "--rm"]
    # joined by the id the target's inspect gave, not by its name (which may be reused)
    assert argv[argv.index("--network") + 1] == f"container:{cid}"
    assert argv[argv.index("--pull") + 1] == "never", "a helper never reaches a registry"
    caps = [argv[i + 1] for i, a in enumerate(argv) if a in ("--cap-add", "--cap-drop")]
    assert caps == ["ALL", "NET_ADMIN", "NET_RAW"], "drop everything, add what iptables needs"
    assert "--privileged" not in argv
    assert argv[argv.index("--entrypoint") + 1] == "/bin/sh"
    assert argv[-1] == helper.default_image()
    # The first run found no image (it gets imported), the second did state, apply, probe.
    assert len(runs(fake_runtime)) == 2


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


def test_default_image_imported_once_from_host_files_and_found_by_tag(
    topo: Topology, fake_runtime: FakeRuntime
) -> None:
    fake_runtime.add("sandbox", topo.sandbox)
    ref = target.container("sandbox")
    helper.status(ref)
    helper.status(ref)
    imports = [c for c in fake_runtime.calls() if c[0] == "import"]
    assert imports == [["import", "-", helper.default_image()]]
    built = fake_runtime.images / helper.default_image().replace(":", "_")
    with tarfile.open(built) as tar:
        names = set(tar.getnames())
    assert {"netcut/bin/ip", "netcut/bin/ss", "netcut/bin/xtables-legacy-multi",
            "netcut/bin/iptables-legacy", "bin/sh", "run"} <= names  # fmt: skip
    assert any(n.endswith("xtables/libxt_standard.so") for n in names)
    assert len(runs(fake_runtime)) == 3, "missing image, then one run per status"


@pytest.mark.parametrize("client", sorted(NO_IMAGE))
def test_no_such_image_is_recognised_from_every_client_and_the_image_built(
    topo: Topology,
    fake_runtime: FakeRuntime,
    monkeypatch: pytest.MonkeyPatch,
    client: str,
) -> None:
    """Docker CE 28 ends its answer with a blank line and `Run 'docker run --help' ...`: a
    check of the last line only never saw "No such image", never built the image and told the
    user only that `docker run --help` exists."""
    monkeypatch.setenv("FAKE_RUNTIME_NO_IMAGE", NO_IMAGE[client])
    fake_runtime.add("sandbox", topo.sandbox)
    assert helper.status(target.container("sandbox")).state == "not cut"
    imports = [c for c in fake_runtime.calls() if c[0] == "import"]
    assert imports == [["import", "-", helper.default_image()]]


def test_an_engine_error_is_kept_whole_in_the_exception_and_the_json(
    topo: Topology,
    fake_runtime: FakeRuntime,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A chosen image is never built: its engine's whole answer, every line, is the error."""
    monkeypatch.setenv("FAKE_RUNTIME_NO_IMAGE", NO_IMAGE["docker 28"])
    fake_runtime.add("sandbox", topo.sandbox)
    image = "netcut-helper:not-there"
    with pytest.raises(ApplyFailed) as caught:
        helper.status(target.container("sandbox"), image=image)
    assert f"No such image: {image}" in str(caught.value)
    assert "Run 'docker run --help' for more information" in str(caught.value)
    code = main(["status", "--container", "sandbox", "--mode", "helper",
                 "--helper-image", image, "--json"])  # fmt: skip
    data = json.loads(capsys.readouterr().out)
    assert code == data["exit_code"] != 0
    assert data["error"].endswith(
        f"docker: Error response from daemon: No such image: {image}\n"
        "Run 'docker run --help' for more information"
    )


@pytest.mark.parametrize("shell", ["bash", "dash", "busybox ash"])
def test_helper_cut_probe_status_restore_with_each_shell(
    topo: Topology, fake_runtime: FakeRuntime, monkeypatch: pytest.MonkeyPatch, shell: str
) -> None:
    """The helper's /bin/sh may be dash or busybox ash: on Linux 6.18 their `read` returns 1
    for a /proc/sys file although it read the value, which failed every state dump
    ("'sysctls' failed (exit 1)"). Here the scripts run in that shell in a real namespace,
    with the host's tools (images without bash: tests/engines)."""
    monkeypatch.setenv("FAKE_RUNTIME_SHELL", shell)
    fake_runtime.add("sandbox", topo.sandbox)
    ref = target.container("sandbox")
    routes = topo.routes()
    result = helper.cut(ref, [topo.proxy], expect_blocked=[f"{topo.upstream_ip}:{topo.echo_port}"])
    assert result.probe is not None
    assert result.probe.ok, result.probe.lines()
    assert not topo.reaches(topo.upstream_ip, topo.echo_port)
    assert helper.status(ref).is_cut
    assert helper.restore(ref).changed
    assert wait_for(lambda: topo.routes() == routes), (routes, topo.routes())
    assert helper.status(ref).state == "not cut"


def test_image_named_by_flag_or_env_is_not_built(
    topo: Topology, fake_runtime: FakeRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_runtime.add("sandbox", topo.sandbox)
    helper.status(target.container("sandbox"), image="example/helper:1")
    monkeypatch.setenv(helper.IMAGE_ENV, "example/helper:2")
    helper.status(target.container("sandbox"))
    used = [c[-1] for c in runs(fake_runtime)]
    assert used == ["example/helper:1", "example/helper:2"]
    assert not [c for c in fake_runtime.calls() if c[0] == "import"]


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
    assert f"ncut_ip -4 route add {topo.gateway}/32 dev eth0 table 254 proto 110" in out
    assert "ncut_iptables -w -N NETCUT" in out
    assert 'echo 1 > "$NCUT_SYS"/net/ipv6/conf/eth0/disable_ipv6' in out
    assert len(runs(fake_runtime)) <= 2, "one run (after the image import), state dump only"
    assert topo.routes() == routes


def test_container_keeping_net_raw_is_refused(
    topo: Topology, fake_runtime: FakeRuntime, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_runtime.add("raw", topo.sandbox, cap_drop=())
    routes = topo.routes()
    assert main(["cut", "--container", "raw", "--mode", "helper"]) == 2
    assert "CAP_NET_RAW" in capsys.readouterr().err
    assert topo.routes() == routes, "the helper started alongside the inspect got no command"


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
    # A PATH with only the fake docker: podman is missing even where it is installed.
    monkeypatch.setenv("PATH", str(fake_runtime.bin))
    assert main(["cut", "--container", "ghost", "--runtime", "podman", "--mode", "helper"]) == 2
    assert "tried podman" in capsys.readouterr().err
    monkeypatch.setenv("NETCUT_CONTAINER_RUNTIME", "nerdctl")
    assert main(["status", "--container", "ghost"]) == 2
    assert "tried nerdctl" in capsys.readouterr().err


def _netns_ino(pid: int) -> int:
    """The namespace inode of `pid` once it runs `sleep` (after `ip netns exec`, setpriv)."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            if f.read().strip() != "sleep":
                return 0
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return 0


def test_helper_and_direct_read_the_same_state_and_both_see_tampering(
    topo: Topology, fake_runtime: FakeRuntime, request: pytest.FixtureRequest
) -> None:
    """Status in helper mode verifies the whole state like direct mode: the helper's dump
    (`iptables -S`, `ip -j rule`) parses to the same filters and policy rules that direct
    mode decodes, a tampered cut is `partial` in both, and a helper `cut` repairs it."""
    from netcut import api
    from netcut.helper.dump import parse_state_dump
    from netcut.helper.script import PRELUDE, state_script

    # The container's process lives in the sandbox namespace, so both modes key one record.
    unprivileged = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                    "--inh-caps=-all", "--bounding-set=-all"]  # fmt: skip
    inside = subprocess.Popen(["ip", "netns", "exec", topo.sandbox, *unprivileged, "sleep", "120"])
    request.addfinalizer(lambda: (inside.kill(), inside.wait()))
    fake_runtime.add("sandbox", topo.sandbox, pid=inside.pid)
    ref = target.container("sandbox")
    want = os.stat(f"/run/netns/{topo.sandbox}").st_ino
    assert wait_for(lambda: _netns_ino(inside.pid) == want), "sleep entered the namespace"
    api.cut(topo.sandbox, [topo.proxy], probe=False)
    script = PRELUDE + state_script((), verify=True)
    dumped = subprocess.run(["ip", "netns", "exec", topo.sandbox, "bash"], input=script,
                            capture_output=True, text=True, check=True).stdout  # fmt: skip
    via_helper = parse_state_dump(dumped)
    fd = os.open(f"/run/netns/{topo.sandbox}", os.O_RDONLY)
    try:
        direct = api.DirectExecutor(fd).read_state((), (), verify=True)
    finally:
        os.close(fd)
    assert via_helper.filters == direct.filters
    unicast = [r for r in direct.policy_rules or () if r.family in (2, 10)]  # not ipmr/ip6mr
    assert via_helper.policy_rules == tuple(unicast)
    assert helper.status(ref).is_cut
    assert not [d for d in helper.status(ref).details if d.startswith("not verified")]

    tamper = ["iptables-legacy", "-I", "OUTPUT", "-j", "ACCEPT"]
    subprocess.run(["ip", "netns", "exec", topo.sandbox, *tamper], check=True)
    assert api.status(topo.sandbox).state == "partial"
    assert helper.status(ref).state == "partial"
    repaired = helper.cut(ref, [topo.proxy], probe=False)
    assert repaired.repaired
    assert api.status(topo.sandbox).is_cut
    assert not topo.reaches(topo.upstream_ip, topo.echo_port)
    assert helper.restore(ref).changed


def _in_ns(topo: Topology, *argv: str) -> None:
    subprocess.run(["ip", "netns", "exec", topo.sandbox, *argv], check=True, capture_output=True)


def _drop_backstop(topo: Topology, tool: str) -> None:
    _in_ns(topo, tool, "-D", "OUTPUT", "-j", "NETCUT")
    _in_ns(topo, tool, "-F", "NETCUT")
    _in_ns(topo, tool, "-X", "NETCUT")


def _marks(topo: Topology) -> NamespaceState:
    fd = os.open(f"/run/netns/{topo.sandbox}", os.O_RDONLY)
    try:
        return DirectExecutor(fd).read_marks()
    finally:
        os.close(fd)


@pytest.mark.parametrize("tamper", ["none", "extra marked route", "IPv4 backstop gone"])
def test_a_restore_from_the_record_removes_every_mark_the_namespace_holds(
    topo: Topology, fake_runtime: FakeRuntime, tamper: str
) -> None:
    """A helper restore with a complete record undoes it without reading the namespace
    first (flow.UndoesIfCut): the backstop is its proof. A marked route the record does not
    hold goes in a second pass; without the IPv4 backstop the marks read in the same request
    plan the undo, as a restore without that shortcut would."""
    fake_runtime.add("sandbox", topo.sandbox)
    ref = target.container("sandbox")
    routes = topo.routes()
    helper.cut(ref, [topo.proxy])
    if tamper == "extra marked route":
        _in_ns(topo, "ip", "route", "add", "198.18.7.0/24", "dev", "eth0", "table", "100",
               "proto", "110")  # fmt: skip
    elif tamper == "IPv4 backstop gone":
        _drop_backstop(topo, "iptables-legacy")

    restored = helper.restore(ref)

    assert (restored.changed, restored.status.state) == (True, "not cut")
    assert _marks(topo) == NamespaceState(links=(), addrs=(), routes=())
    assert wait_for(lambda: topo.routes() == routes), (routes, topo.routes())
    assert topo.reaches(topo.upstream_ip, topo.echo_port)
    if tamper == "extra marked route":
        assert any("198.18.7.0/24" in line for line in restored.lines), restored.lines


def test_a_record_whose_namespace_holds_no_mark_is_dropped_and_nothing_put_back(
    topo: Topology, fake_runtime: FakeRuntime
) -> None:
    """No backstop and no marked route: the record is not this namespace's cut (a cut that
    never started, or a reused namespace inode). Undoing it would add routes the namespace
    never had, so the restore changes nothing and forgets the record."""
    fake_runtime.add("sandbox", topo.sandbox)
    ref = target.container("sandbox")
    helper.cut(ref, [topo.proxy])
    _drop_backstop(topo, "iptables-legacy")
    _drop_backstop(topo, "ip6tables-legacy")
    for route in _marks(topo).marked_routes:
        family = "-6" if route.family == socket.AF_INET6 else "-4"
        dst = f"{route.dst}/{route.dst_len}" if route.dst else "default"
        _in_ns(topo, "ip", family, "route", "del", dst, "table", str(route.table),
               "proto", "110")  # fmt: skip
    assert _marks(topo) == NamespaceState(links=(), addrs=(), routes=())
    cut_routes = topo.routes()

    restored = helper.restore(ref)

    assert not restored.changed
    assert restored.status.details == ("stale record ignored",)
    assert topo.routes() == cut_routes  # the routes the cut deleted stay deleted
    assert not helper.restore(ref).changed  # and the record is gone

"""The engine scripts' own checks (docs/netcut.md#engines-in-ci): up.sh names each missing
binary with its Debian package before it starts anything, and leftovers.sh, which .ci/run
runs before and after the tests, reports an earlier run's state instead of removing it."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
ENGINES = ROOT / "tests" / "engines"


def _path_without(tmp: pathlib.Path, *absent: str) -> str:
    """A PATH holding links to the tools up.sh checks (where this machine has them) and the
    shell utilities it uses, except `absent`."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    wanted = re.findall(r"(\S+):\S+", (ENGINES / "up.sh").read_text().split("missing=()")[1][:400])
    for tool in {*wanted, "bash", "dirname", "mkdir", "cat"} - set(absent):
        found = shutil.which(
            tool, path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        )
        if found:
            (bin_dir / tool).symlink_to(found)
    return str(bin_dir)


def test_up_names_a_missing_binary_and_its_package_before_starting_anything(
    tmp_path: pathlib.Path,
) -> None:
    """A machine where docker.io was removed stopped at `up.sh: dockerd: command not found`
    with containerd already started."""
    run_dir = tmp_path / "run"
    env = {**os.environ, "PATH": _path_without(tmp_path, "dockerd"),
           "NETCUT_CI_RUN": str(run_dir), "NETCUT_CI_DATA": str(tmp_path / "data")}  # fmt: skip
    done = subprocess.run(["bash", str(ENGINES / "up.sh")], env=env, capture_output=True,
                          text=True, timeout=30, check=False)  # fmt: skip
    assert done.returncode == 1
    assert "dockerd (Debian package docker.io)" in done.stderr
    assert "./dev.sh engines" in done.stderr
    assert not run_dir.exists(), "nothing started, nothing created"


def test_leftovers_reports_an_earlier_run_and_removes_nothing(tmp_path: pathlib.Path) -> None:
    run_dir, data_dir = tmp_path / "run", tmp_path / "data"
    env = {**os.environ, "NETCUT_CI_RUN": str(run_dir), "NETCUT_CI_DATA": str(data_dir)}
    script = str(ENGINES / "leftovers.sh")

    def check() -> subprocess.CompletedProcess[str]:
        return subprocess.run([script], env=env, capture_output=True, text=True, timeout=30,
                              check=False)  # fmt: skip

    clean = check()  # (this machine's engines may be up: only our directories count here)
    assert str(data_dir) not in clean.stdout
    (data_dir / "docker" / "image").mkdir(parents=True)
    left = check()
    assert left.returncode == 1
    assert f"left over: {data_dir}" in left.stdout
    assert (data_dir / "docker" / "image").is_dir(), "a check, not a cleanup"


def test_leftovers_reports_podman_state_the_run_created_or_changed_and_not_the_machines(
    tmp_path: pathlib.Path,
) -> None:
    """Root podman writes its blob info cache to /var/lib/containers/cache whatever its
    configuration: after a run from a fresh clone that directory existed on a machine where
    it had not, and leftovers.sh said nothing. A machine's own podman state is no leftover;
    what a run created or changed there is."""
    own, fresh = tmp_path / "containers", tmp_path / "cni"
    (own / "storage" / "overlay").mkdir(parents=True)
    (own / "storage" / "storage.lock").write_text("machine")
    env = {
        **os.environ,
        "NETCUT_CI_RUN": str(tmp_path / "run"),
        "NETCUT_CI_DATA": str(tmp_path / "data"),
        "NETCUT_MACHINE_PATHS": f"{own} {fresh}",
    }
    record = tmp_path / "before"

    def check(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(ENGINES / "leftovers.sh"), *args], env=env,
                              capture_output=True, text=True, timeout=30, check=False)  # fmt: skip

    assert str(own) not in check("--record", str(record)).stdout, "the machine's own"
    assert str(own) not in check("--since", str(record)).stdout, "unchanged"
    (own / "cache").mkdir()
    (own / "cache" / "blob-info-cache-v1.boltdb").write_bytes(b"\0" * 64)
    (fresh / "results").mkdir(parents=True)
    (own / "storage" / "storage.lock").write_text("touched by the run")
    left = check("--since", str(record))
    assert left.returncode == 1
    for path in (own / "cache" / "blob-info-cache-v1.boltdb", fresh / "results",
                 own / "storage" / "storage.lock"):  # fmt: skip
        assert f"left over: {path} (created or changed during the run" in left.stdout
    assert f"left over: {own / 'storage'} " not in left.stdout, "a directory by existence"
    assert (own / "cache" / "blob-info-cache-v1.boltdb").exists(), "a check, not a cleanup"


def test_leftovers_reports_empty_shim_directories_but_not_a_live_containerds(
    tmp_path: pathlib.Path,
) -> None:
    """containerd's shim writes runc's state under /run/containerd whatever the daemon's root:
    the empty tree a run leaves there counts; one holding a socket (a containerd of the
    machine's own) does not."""
    shim = tmp_path / "containerd"
    env = {
        **os.environ,
        "NETCUT_CI_RUN": str(tmp_path / "run"),
        "NETCUT_CI_DATA": str(tmp_path / "data"),
        "NETCUT_CONTAINERD_SHIM_DIR": str(shim),
    }

    def check() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(ENGINES / "leftovers.sh")],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    assert str(shim) not in check().stdout
    (shim / "runc" / "ncn123x1").mkdir(parents=True)
    (shim / "s").mkdir()
    if not _containerd_running():
        left = check()
        assert f"left over: {shim} (3 empty directories" in left.stdout
        assert left.returncode == 1
    (shim / "containerd.sock").touch()
    assert str(shim) not in check().stdout
    assert (shim / "runc" / "ncn123x1").is_dir(), "a check, not a cleanup"


def _containerd_running() -> bool:
    return (
        subprocess.run(["pgrep", "-x", "containerd"], capture_output=True, check=False).returncode
        == 0
    )


def test_ci_checks_for_leftovers_before_and_after_under_the_machine_lock() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    marks = ("flock -n 7", "if ! tests/engines/leftovers.sh --record", "./dev.sh test -p")
    lock, before, test = (ci.index(m) for m in marks)
    after = ci.rindex("tests/engines/leftovers.sh --since")
    assert lock < before < test < after
    dev = (ROOT / "dev.sh").read_text()
    assert "flock" in dev
    up = (ENGINES / "up.sh").read_text()
    # machine-wide, only the run's user: its accounts (useradd/groupadd) and subordinate ids,
    # recorded for down.sh; no configuration
    written = set(re.findall(r"/etc/[\w.$/-]*", up.split("set -euo pipefail")[1]))
    assert written <= {"/etc/subuid", "/etc/subgid", "/etc/$file", "/etc/login.defs",
                       "/etc/docker"}, written  # fmt: skip
    assert "helperimage" not in up, "no helper image built ahead of time"


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("podman"), reason="root (a mount namespace) and podman"
)
def test_a_session_without_an_engine_run_never_opens_podmans_default_store(
    tmp_path: pathlib.Path,
) -> None:
    """Every session that collects tests/engines asks each engine whether it is up. Without
    an engine run that question went to podman on the machine's default configuration, which
    created its store (/var/lib/containers/storage) and short-name alias lock
    (/var/cache/containers). Observed here in a mount namespace of the test's own, with
    tmpfs over /var/lib and /var/cache, so the machine's are never touched."""
    probe = (
        f"import sys; sys.path.insert(0, {str(ENGINES)!r}); import enginelib; "
        "print(enginelib.engine_down('podman'))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTAINERS_")}
    env["NETCUT_CI_RUN"] = str(tmp_path / "no-run")
    script = (
        'mount -t tmpfs probe /var/lib && mount -t tmpfs probe /var/cache && "$0" -c "$1"; '
        "find /var/lib /var/cache -mindepth 1"
    )
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script,
                           sys.executable, probe], env=env, capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    said, *written = done.stdout.splitlines()
    assert "tests/engines/up.sh" in said
    assert written == [], "podman wrote machine-wide state"


def _instance_env(tmp_path: pathlib.Path, **extra: str) -> dict[str, str]:
    """An engine instance of the test's own: directories under tmp_path, a name no other run
    has (the suite's own run's user must not count here), the default bridges and subnets
    whatever the suite's run chose (the userns tests have a network namespace of their own)."""
    return {
        **os.environ,
        "NETCUT_CI_RUN": str(tmp_path / "run"),
        "NETCUT_CI_DATA": str(tmp_path / "data"),
        "NETCUT_CI_NAME": f"ncunit-{os.getpid()}",
        "NETCUT_CI_BRIDGES": "nc",
        "NETCUT_CI_NET": "250",
        "NETCUT_MACHINE_PATHS": str(tmp_path / "no-podman-state"),
        **extra,
    }


def _ip(*argv: str) -> None:
    subprocess.run(["ip", *argv], check=True, capture_output=True, timeout=10)


@pytest.mark.userns
def test_leftovers_tells_the_runs_bridges_from_the_machines(tmp_path: pathlib.Path) -> None:
    """leftovers.sh reported any docker0 as the run's, so .ci/run could not run on a machine
    whose own Docker runs on docker0; and nothing noticed the run re-addressing or deleting
    it. Now: the machine's docker0 is no leftover, the run's bridges are (by name, or by an
    address of the run's subnets), and --since reports a machine bridge changed or gone."""
    env = _instance_env(tmp_path)
    record = str(tmp_path / "before")

    def check(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(ENGINES / "leftovers.sh"), *args], env=env,
                              capture_output=True, text=True, timeout=30, check=False)  # fmt: skip

    _ip("link", "add", "docker0", "type", "bridge")
    _ip("addr", "add", "172.17.0.1/16", "dev", "docker0")
    before = check("--record", record)
    assert "docker0" not in before.stdout, before.stdout
    assert check("--since", record).stdout == ""
    _ip("link", "add", "ncdnet0", "type", "bridge")  # the run's, by name
    _ip("link", "add", "br-0123456789ab", "type", "bridge")  # an older version's nc-ci
    _ip("addr", "add", "198.19.251.1/24", "dev", "br-0123456789ab")
    left = check()
    assert left.returncode == 1
    assert "left over: bridge ncdnet0\n" in left.stdout
    assert "left over: bridge br-0123456789ab (198.19.251.1/24: the run's subnet" in left.stdout
    assert "docker0" not in left.stdout
    _ip("link", "del", "ncdnet0")
    _ip("link", "del", "br-0123456789ab")
    # what up.sh's --bip did to the machine's docker0, then what down.sh did
    _ip("addr", "flush", "dev", "docker0")
    _ip("addr", "add", "198.19.250.1/24", "dev", "docker0")
    readdressed = check("--since", record)
    assert readdressed.returncode == 1
    assert (
        "left over: bridge docker0 (the machine's) was 172.17.0.1/16, is now 198.19.250.1/24"
        in readdressed.stdout
    )
    _ip("link", "del", "docker0")
    gone = check("--since", record)
    assert "bridge docker0 (the machine's) was 172.17.0.1/16, is now gone" in gone.stdout


@pytest.mark.userns
def test_up_refuses_a_bridge_name_or_subnet_in_use_before_starting_anything(
    tmp_path: pathlib.Path,
) -> None:
    """Two runs must not share a bridge or a subnet: another instance's (or the machine's)
    would be taken over and then deleted by this run's down.sh."""
    env = _instance_env(tmp_path)

    def up() -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(ENGINES / "up.sh")], env=env, capture_output=True,
                              text=True, timeout=30, check=False)  # fmt: skip

    _ip("link", "add", "ncpod0", "type", "bridge")
    refused = up()
    assert refused.returncode == 1
    assert "a link named ncpod0 exists" in refused.stderr
    _ip("link", "del", "ncpod0")
    _ip("link", "add", "other0", "type", "bridge")
    _ip("addr", "add", "198.19.251.7/24", "dev", "other0")
    refused = up()
    assert refused.returncode == 1
    assert "198.19.251.0/24 is in use on this machine" in refused.stderr
    assert "NETCUT_CI_NET" in refused.stderr
    assert not (tmp_path / "run").exists(), "nothing started, nothing created"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("NETCUT_CI_NET", "251"),  # its fourth /24 would be the boundary tests' 198.19.254
        ("NETCUT_CI_NET", "25"),
        ("NETCUT_CI_NET", "250; rm"),
        ("NETCUT_CI_BRIDGES", "prefixtoolong"),  # prefixtoolongdnet0: over 15 characters
        ("NETCUT_CI_BRIDGES", "nc-"),
        ("NETCUT_CI_NAME", "Netcut_CI"),
        ("NETCUT_CI_RUN", "relative/run"),
    ],
)
def test_an_instance_refuses_names_and_subnets_it_cannot_use(
    tmp_path: pathlib.Path, name: str, value: str
) -> None:
    env = _instance_env(tmp_path, **{name: value})
    for script in ("up.sh", "down.sh", "leftovers.sh"):
        done = subprocess.run(["bash", str(ENGINES / script)], env=env, capture_output=True,
                              text=True, timeout=30, check=False)  # fmt: skip
        assert done.returncode == 2, (script, done.stderr)
        assert name in done.stderr
    assert not (tmp_path / "run").exists()

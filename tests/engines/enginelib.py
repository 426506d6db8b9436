"""Helpers for the real-engine tests (fixtures live in conftest.py): the daemons' sockets,
the test image, and test containers (`Box`) on each engine."""

from __future__ import annotations

import contextlib
import io
import itertools
import os
import subprocess
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

REQUIRE_ENV = "EGRESS_REQUIRE_ENGINE"
RUN_DIR = os.environ.get("NETCUT_CI_RUN", "/run/netcut-ci")
BOX = "netcut-ci-box:latest"
CTR_NAMESPACE = "default"  # where up.sh imported the box image
_counter = itertools.count(1)


def _ci_env() -> None:
    """Point the clients at up.sh's engines and podman's private configuration (the variables
    of $NETCUT_CI_RUN/env) where the caller did not choose, and put the run's own `podman`
    first on PATH (up.sh's, which keeps image copies from writing machine-wide state)."""
    try:
        with open(f"{RUN_DIR}/env") as f:
            lines = f.read().splitlines()
    except OSError:
        return
    for line in lines:
        name, sep, value = line.removeprefix("export ").partition("=")
        path = os.environ.get("PATH", "")
        if name == "PATH" and value.endswith(":$PATH"):
            first = value.removesuffix(":$PATH")
            if first not in path.split(os.pathsep):
                os.environ["PATH"] = f"{first}{os.pathsep}{path}"
        elif sep and not os.environ.get(name):
            os.environ[name] = value


_ci_env()

# The run's networks (tests/engines/instance.sh chooses them; $NETCUT_CI_RUN/env names them)
DOCKER_GATEWAY = os.environ.get("NETCUT_CI_DOCKER_GATEWAY", "198.19.251.1")  # nc-ci's
PODMAN_GATEWAY = os.environ.get("NETCUT_CI_PODMAN_GATEWAY", "198.19.252.1")
CTR_NET = os.environ.get("NETCUT_CI_CTR_NET", "198.19.253")  # containerd boxes' veths, /30s


def sh(*argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(argv)}: {done.stderr.strip() or done.stdout.strip()}")
    return done


# Where root podman keeps state of its own whatever its configuration: its default store and,
# in cache/, the blob info cache every image copy writes (docs/netcut.md#engines-in-ci).
PODMAN_MACHINE_DIR = "/var/lib/containers"


def machine_podman_state() -> dict[str, tuple[int, int] | None]:
    """Every file (size, mtime) and directory (None) under PODMAN_MACHINE_DIR."""
    found: dict[str, tuple[int, int] | None] = {}
    for top, _dirs, files in os.walk(PODMAN_MACHINE_DIR):
        found[top] = None
        for name in files:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(top, name))
                found[os.path.join(top, name)] = (st.st_size, st.st_mtime_ns)
    return found


def engine_down(engine: str) -> str | None:
    """Why `engine` cannot be used, or None when it answers and has the box image.

    podman is asked only with a test run's configuration: without one it opens the machine's
    default store, and creates it (/var/lib/containers/storage, /run/libpod, ...) where there
    was none, in every session that collected these tests without an engine run."""
    if engine == "podman" and not os.environ.get("CONTAINERS_STORAGE_CONF"):
        return (
            "podman has no test run's configuration (CONTAINERS_STORAGE_CONF: tests/engines/up.sh)"
        )
    probes = {
        "docker": ["docker", "image", "inspect", BOX],
        "podman": ["podman", "image", "exists", BOX],
        "containerd": ["ctr", "-n", CTR_NAMESPACE, "images", "ls", "-q"],
    }
    try:
        done = sh(*probes[engine], check=False, timeout=30)
    except (FileNotFoundError, subprocess.TimeoutExpired) as exc:
        return f"{engine}: {exc}"
    if done.returncode != 0 or (engine == "containerd" and BOX not in done.stdout):
        return f"{engine} has no engine or no {BOX} (run tests/engines/up.sh): {done.stderr[:200]}"
    return None


@dataclass
class Box:
    """A running test container: its engine, name, PID and the gateway it routes through."""

    engine: str
    name: str
    pid: int
    gateway: str
    ip: str
    cleanup: list[Callable[[], object]] = field(default_factory=list)

    @property
    def netns(self) -> str:
        return f"/proc/{self.pid}/ns/net"

    def routes(self) -> str:
        return sh("nsenter", f"--net={self.netns}", "ip", "route", "show", "table", "all").stdout

    def routes_back_to(self, expected: str, timeout: float = 30.0) -> str:
        """The routes once they equal `expected`, else as they are at the deadline. A restore
        sets disable_ipv6 back to 0 and the kernel regenerates eth0's link-local address, whose
        `local fe80::…` route appears only when its DAD completes (a second or two, more on a
        busy machine): poll for it instead of comparing at once."""
        deadline = time.monotonic() + timeout
        while (now := self.routes()) != expected and time.monotonic() < deadline:
            time.sleep(0.05)
        return now


def _pid(engine: str, name: str) -> int:
    out = sh(engine, "inspect", "--format", "{{.State.Pid}}", name).stdout.strip()
    return int(out)


def _ip(engine: str, name: str) -> str:
    fmt = "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}"
    return sh(engine, "inspect", "--format", fmt, name).stdout.strip()


def start_box(engine: str, *, drop_all: bool = True) -> Box:
    name = f"nc-e{os.getpid()}-{next(_counter)}"
    if engine == "containerd":
        box = Box("containerd", name, 0, "", "")
        try:
            return _start_ctr_box(box)
        except BaseException:
            for step in box.cleanup:
                step()
            raise
    # Without drop_all the container holds NET_RAW: docker's default set has it, podman's
    # (containers.conf) does not, so it is added there.
    caps = ["--cap-drop", "ALL"] if drop_all else []
    if not drop_all and engine == "podman":
        caps = ["--cap-add", "NET_RAW"]
    net = ["--network", "nc-ci"] if engine == "docker" else []
    sh(engine, "run", "-d", "--rm", "--name", name, *caps, *net, BOX, "sleep", "3600")
    gateway = DOCKER_GATEWAY if engine == "docker" else PODMAN_GATEWAY
    box = Box(engine, name, _pid(engine, name), gateway, _ip(engine, name))
    kill = ["rm", "-f"] if engine == "docker" else ["rm", "-f", "-t", "0"]
    box.cleanup.append(lambda: sh(engine, *kill, name, check=False))
    return box


def _start_ctr_box(box: Box) -> Box:
    """`ctr run` gives a container no network; it gets a veth of its own here, the host side
    in the root namespace on a /30 of CTR_NET.0/24 (the gateway it routes through)."""
    ctr, name = ["ctr", "-n", CTR_NAMESPACE], box.name

    def remove() -> None:
        sh(*ctr, "tasks", "kill", "-s", "KILL", name, check=False)
        for _ in range(100):
            if sh(*ctr, "tasks", "delete", name, check=False).returncode == 0:
                break
            if "not found" in sh(*ctr, "tasks", "ls", check=False).stdout:
                break
        sh(*ctr, "containers", "delete", name, check=False)

    box.cleanup.append(remove)
    # ctr 1.6 knows no "ALL": drop, from every set, the capabilities that could undo a cut.
    drop = [a for c in ("NET_RAW", "NET_ADMIN", "SYS_ADMIN") for a in ("--cap-drop", f"CAP_{c}")]
    sh(*ctr, "run", "-d", *drop, f"docker.io/library/{BOX}", name, "sleep", "3600")
    from netcut.resolve import parse_ctr_tasks

    box.pid = parse_ctr_tasks(sh(*ctr, "task", "ls").stdout)[name][0]
    n = (os.getpid() + next(_counter)) % 64
    host, inside = f"{CTR_NET}.{4 * n + 1}", f"{CTR_NET}.{4 * n + 2}"
    link = f"ncct{os.getpid() % 100000}x{n}"
    sh("ip", "link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", str(box.pid))
    box.cleanup.insert(0, lambda: sh("ip", "link", "del", link, check=False))
    sh("ip", "addr", "add", f"{host}/30", "dev", link)
    sh("ip", "link", "set", link, "up")
    inns = ["nsenter", f"--net={box.netns}", "ip"]
    sh(*inns, "addr", "add", f"{inside}/30", "dev", "eth0")
    sh(*inns, "link", "set", "eth0", "up")
    sh(*inns, "link", "set", "lo", "up")
    sh(*inns, "route", "add", "default", "via", host)
    box.gateway, box.ip = host, inside
    # The kernel gives eth0 its IPv6 link-local address (and routes) a moment after it comes
    # up: wait for them, so that the routes the tests compare are the settled ones.
    deadline = time.monotonic() + 30
    while "fe80::/64 dev eth0" not in sh(*inns, "-6", "route", "show").stdout:
        assert time.monotonic() < deadline, "eth0 never got its IPv6 link-local route"
        time.sleep(0.05)
    return box


# ---------------------------------------------------------------- docker clients

# The docker clients these machines carry (docs/netcut.md#engines-in-ci): Docker CE's current
# one, first on PATH, and Debian's docker.io 20.10.
DOCKER_CLIENTS = {"ce": ("/usr/local/bin/docker", "28."), "debian": ("/usr/bin/docker", "20.10.")}


def docker_client_path(client: str, bin_dir: str) -> str:
    """A PATH on which `docker` is `client`'s binary (a link in `bin_dir`), after checking
    that it is the version it should be. netcut and these tests find docker on PATH."""
    binary, version = DOCKER_CLIENTS[client]
    if not os.path.exists(binary):
        raise AssertionError(f"docker client {client!r} not installed at {binary}")
    os.makedirs(bin_dir, exist_ok=True)
    link = os.path.join(bin_dir, "docker")
    if not os.path.islink(link):
        os.symlink(binary, link)
    said = sh(link, "version", "--format", "{{.Client.Version}}").stdout.strip()
    assert said.startswith(version), f"{binary} is client {said}, expected {version}x"
    return f"{bin_dir}:{os.environ['PATH']}"


# ---------------------------------------------------------------- helper images by shell

# Helper images whose /bin/sh is not bash, assembled offline from this host's files like the
# default one (netcut/helper/image.py): "ash" is Alpine-like (busybox-static as /bin/sh and
# its applets, iproute2 and iptables-legacy; no bash, no netcat: the probe uses busybox
# `nc -e`), "dash" is Debian-like (dash as /bin/sh, bash and coreutils' timeout beside it).
HELPER_SHELLS = ("ash", "dash")
_built: set[tuple[str, str]] = set()


def shell_image(engine: str, shell: str) -> str:
    """The tag of the `shell` helper image in `engine`, imported on first use."""
    import io
    import tarfile

    from netcut.helper import image as helperimage

    tag = f"nc-helper-{shell}:ci"
    if (engine, shell) in _built:
        return tag
    src = helperimage.find_sources()
    files = {
        "/sbin/ip": src.tools["ip"],
        "/usr/sbin/ss": src.tools["ss"],
        "/sbin/xtables-legacy-multi": src.tools["xtables-legacy-multi"],
        # reads the nat rules docker writes with iptables-nft (its DNS redirection)
        "/sbin/xtables-nft-multi": src.tools["xtables-nft-multi"],
    }
    files.update({p: p for p in src.files() if p.endswith(".so")})  # xtables extensions
    links = {f"/sbin/{n}": "xtables-legacy-multi" for n in
             ("iptables-legacy", "ip6tables-legacy", "iptables-legacy-save",
              "ip6tables-legacy-save")}  # fmt: skip
    links["/sbin/iptables-nft-save"] = "xtables-nft-multi"
    if shell == "ash":
        files["/bin/busybox"] = "/bin/busybox"
        links.update({f"/bin/{a}": "busybox" for a in ("sh", "true", "cat", "ls", "sleep")})
    else:
        files["/bin/dash"] = os.path.realpath("/bin/dash")
        files["/bin/bash"] = os.path.realpath("/bin/bash")
        files["/usr/bin/timeout"] = os.path.realpath("/usr/bin/timeout")
        links["/bin/sh"] = "dash"
    for lib in helperimage.libraries(sorted({h for h in files.values() if not h.endswith(".so")})):
        files.setdefault(lib, lib)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        dirs = {"/tmp", "/run", "/proc", "/sys", "/dev", "/etc", *map(os.path.dirname, files),
                *map(os.path.dirname, links)}  # fmt: skip
        for d in sorted(dirs):
            parts = d.strip("/").split("/")
            for i in range(1, len(parts) + 1):
                name = "/".join(parts[:i])
                if name not in tar.getnames():
                    info = tarfile.TarInfo(name)
                    info.type, info.mode = tarfile.DIRTYPE, 0o1777 if name == "tmp" else 0o755
                    tar.addfile(info)
        for inside, host in sorted(files.items()):
            tar.add(os.path.realpath(host), arcname=inside.lstrip("/"))
        for inside, target in sorted(links.items()):
            info = tarfile.TarInfo(inside.lstrip("/"))
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    if engine == "containerd":
        argv = ["ctr", "-n", CTR_NAMESPACE, "images", "import", "-"]
        payload = helperimage.oci_archive(buf.getvalue(), tag)
    else:
        argv, payload = [engine, "import", "-", tag], buf.getvalue()
    done = subprocess.run(argv, input=payload, capture_output=True, timeout=300, check=False)

    assert done.returncode == 0, done.stderr.decode(errors="replace")
    _built.add((engine, shell))
    return tag


def harbor_task_rootfs() -> bytes:
    """The host's static busybox with a link per applet, `/bin/bash` running busybox's sh
    (Harbor execs `bash -c`) and a passwd with root (Harbor's `-u root`): a task image made
    offline, for `docker import` (the Harbor engine tests')."""
    applets = subprocess.run(
        ["/bin/busybox", "--list"], capture_output=True, text=True, check=True
    ).stdout.split()
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name in ("bin", "tmp", "etc", "app"):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if name == "tmp" else 0o755
            tar.addfile(info)
        tar.add("/bin/busybox", "bin/busybox")
        for applet in applets:
            if applet != "busybox":
                link = tarfile.TarInfo(f"bin/{applet}")
                link.type, link.linkname = tarfile.SYMTYPE, "busybox"
                tar.addfile(link)
        for path, data, mode in (
            ("bin/bash", b'#!/bin/sh\nexec /bin/sh "$@"\n', 0o755),
            ("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n", 0o644),
            ("etc/group", b"root:x:0:\n", 0o644),
        ):
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()

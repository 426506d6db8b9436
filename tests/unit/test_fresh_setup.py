"""The fresh-machine install names the package of every file netcut loads (docs/netcut.md#install).

The bug this guards against: dev.sh installed Debian's `iptables` only when `libip4tc` was
missing, but python-iptables also loads the xtables extension directory (libxt_*.so), which
only the `iptables` package ships; a machine with libip4tc2 alone failed with "can't find
directory with extensions". Here every shared object python-iptables loads for netcut's
backstop is traced to its Debian package, which must be in dev.sh's unconditional install list
or a direct dependency of one there.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The extensions the backstop's rules use (netcut/direct/iptables.py): tcp/udp matches, REJECT and
# the standard target, for IPv4 and IPv6.
EXTENSIONS = (
    "libxt_tcp.so",
    "libxt_udp.so",
    "libxt_standard.so",
    "libipt_REJECT.so",
    "libip6t_REJECT.so",
)

pytestmark = pytest.mark.skipif(shutil.which("dpkg") is None, reason="not a Debian machine")


def _dev_sh_packages(name: str) -> set[str]:
    text = (ROOT / "dev.sh").read_text()
    match = re.search(rf"^{name}=\(([^)]*)\)", text, re.MULTILINE)
    assert match, f"dev.sh has no {name}=(...) list"
    return set(match.group(1).split())


def _owner(path: str) -> str:
    """The Debian package shipping `path` (tried as given, resolved, and with /usr moved)."""
    real = os.path.realpath(path)
    candidates = dict.fromkeys([path, real, real.removeprefix("/usr"), "/usr" + real])
    for candidate in candidates:
        done = subprocess.run(
            ["dpkg", "-S", candidate], capture_output=True, text=True, check=False
        )
        if done.returncode == 0:
            return done.stdout.split(":", 1)[0].strip()
    raise AssertionError(f"no Debian package ships {path}")


def _depends(package: str) -> set[str]:
    done = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Depends} ${Pre-Depends}", package],
        capture_output=True,
        text=True,
        check=False,
    )
    names = re.findall(r"(?:^|[,|]\s*)([a-z0-9][a-z0-9.+-]+)", done.stdout)
    return set(names)


def _loaded_files() -> list[str]:
    """What python-iptables opens: libxtables, libip4tc, libip6tc and the extensions."""
    from iptc import ip4tc, ip6tc, xtables

    sonames = [lib._name for lib in (xtables._lib_xtables, ip4tc._libiptc, ip6tc._libiptc)]
    with open("/proc/self/maps") as f:  # where the loader found them
        mapped = {line.split()[-1] for line in f if "/" in line}
    files = [next(p for p in mapped if os.path.basename(p).startswith(n)) for n in sonames]
    files += [os.path.join(xtables._xtables_libdir, name) for name in EXTENSIONS]
    return files


def test_every_loaded_file_comes_from_a_package_dev_sh_installs() -> None:
    packages = _dev_sh_packages("SYSTEM_PACKAGES")
    assert "iptables" in packages, "the xtables extension directory ships in `iptables`"
    allowed = packages.union(*(_depends(p) for p in packages))
    for path in _loaded_files():
        assert os.path.exists(path), path
        owner = _owner(path)
        assert owner in allowed, f"{path} ships in {owner}, which dev.sh does not install"
    assert _owner(_loaded_files()[-1]) == "iptables"


def test_test_packages_cover_the_browser_test() -> None:
    """The report's browser test runs Debian's chromium: dev.sh test installs it."""
    assert "chromium" in _dev_sh_packages("TEST_PACKAGES")
    found = shutil.which("chromium", path="/usr/sbin:/usr/bin:/sbin:/bin")
    if found is not None:
        assert _owner(os.path.realpath(found)) == "chromium"


def test_engine_packages_cover_the_engine_tests() -> None:
    engines = _dev_sh_packages("ENGINE_PACKAGES")
    assert {"podman", "docker.io", "containerd", "runc", "busybox-static"} <= engines
    # the run's unprivileged user: rootless podman and the ACLs up.sh gives it
    assert {"uidmap", "slirp4netns", "acl"} <= engines
    for tool, package in (
        ("dockerd", "docker.io"),
        ("ctr", "containerd"),
        ("podman", "podman"),
        ("busybox", "busybox-static"),
        ("newuidmap", "uidmap"),
        ("slirp4netns", "slirp4netns"),
        ("setfacl", "acl"),
    ):
        found = shutil.which(tool, path="/usr/sbin:/usr/bin:/sbin:/bin")
        if found is not None:  # where it is installed, it came from that package
            assert _owner(found) == package


def test_ci_starts_the_engines_and_requires_them() -> None:
    """CI runs the README's test command, which starts the engines behind a trap set first."""
    ci = (ROOT / ".ci" / "run").read_text()
    assert "EGRESS_REQUIRE_ENGINE=1" in ci
    assert "./dev.sh test" in ci
    dev = (ROOT / "dev.sh").read_text()
    test_cmd = dev[dev.index("    test)") :].split(";;")[0]
    assert "tests/engines/up.sh" in test_cmd
    assert "trap 'tests/engines/down.sh' EXIT" in test_cmd.split("tests/engines/up.sh")[0], (
        "stopped by a trap set first"
    )


def _dpkg_status(tmp: pathlib.Path, states: dict[str, str]) -> dict[str, str]:
    """A real dpkg database (the `status` file dpkg-query reads) holding `states`; the
    environment that points dpkg at it (DPKG_ADMINDIR), so the machine's own is not touched."""
    (tmp / "info").mkdir()
    (tmp / "updates").mkdir()
    stanzas = []
    for name, status in states.items():
        conffiles = f"Conffiles:\n /etc/{name}.conf {'0' * 32}\n" if "config" in status else ""
        stanzas.append(
            f"Package: {name}\nStatus: {status}\nPriority: optional\nSection: misc\n"
            "Maintainer: nobody <nobody@example.invalid>\nArchitecture: all\nVersion: 1.0\n"
            f"{conffiles}Description: a test package\n"
        )
    (tmp / "status").write_text("\n".join(stanzas))
    return {**os.environ, "DPKG_ADMINDIR": str(tmp)}


def test_a_removed_package_that_kept_its_configuration_counts_as_missing(
    tmp_path: pathlib.Path,
) -> None:
    """`dpkg -s` exits 0 for a package in state `rc` (removed, configuration files left): a
    machine where docker.io had been removed that way installed nothing and then failed on
    `dockerd: command not found`. dev.sh reads the installed state instead."""
    env = _dpkg_status(
        tmp_path,
        {"nc-removed": "deinstall ok config-files", "nc-present": "install ok installed"},
    )
    old = subprocess.run(["dpkg", "-s", "nc-removed"], env=env, capture_output=True, check=False)
    assert old.returncode == 0, "dpkg -s calls a removed package installed (the bug)"
    done = subprocess.run(
        [str(ROOT / "dev.sh"), "missing", "nc-removed", "nc-present", "nc-never-seen"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["nc-removed", "nc-never-seen"]


def test_apt_install_asks_dpkg_query_for_the_installed_state() -> None:
    dev = (ROOT / "dev.sh").read_text()
    assert 'dpkg -s "$' not in dev
    assert "dpkg-query -W -f='${Status}'" in dev
    assert '"install ok installed"' in dev

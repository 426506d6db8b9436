"""A test engine run leaves the machine's own engines as they are (docs/netcut.md#engines-in-ci).

On a machine whose own dockerd runs on `docker0` (172.17.0.1/16, as on every framework user's
workstation), up.sh once started its dockerd with `--bip` and no bridge of its own, which
re-addressed that `docker0`, and down.sh then deleted it. Here a whole second run (up.sh,
a docker run as its unprivileged user, down.sh, the leftover checks around them) runs in a
network namespace of its own that holds such a `docker0`, with names of its own beside the
suite's run: `docker0` keeps its address through the run and after it, and the leftover
check finds nothing of the run and nothing of the machine changed.
"""

from __future__ import annotations

import os
import subprocess

import pytest

ENGINES = os.path.dirname(os.path.abspath(__file__))

SCRIPT = r"""
set -uo pipefail
ip link set lo up
ip link add docker0 type bridge
ip addr add 172.17.0.1/16 dev docker0
ip link set docker0 up
state() { echo "$1: docker0 $(ip -4 -o addr show dev docker0 2>&1 | awk '{ print $4 }')"; }
trap '"$ENGINES/down.sh" >/dev/null 2>&1' EXIT
"$ENGINES/leftovers.sh" --record "$RECORD" || echo "record: dirty"
"$ENGINES/up.sh" 2>"$RECORD.up" ||
    { echo "up: failed"; cat "$RECORD.up" "$NETCUT_CI_RUN"/dockerd.log; }
state after-up
# the run's unprivileged user reaches the run's docker (and so the run's docker works)
read -r uid gid <"$NETCUT_CI_RUN/user.ids"
mapfile -t user_env <"$NETCUT_CI_RUN/user/env"
(cd / && setpriv --reuid="$uid" --regid="$gid" --init-groups --inh-caps=-all \
    env -i "${user_env[@]}" docker run --rm netcut-ci-box:latest sh -c 'echo user-docker: ok')
"$ENGINES/down.sh" 2>/dev/null
state after-down
"$ENGINES/leftovers.sh" --since "$RECORD" && echo "leftovers: none"
"""


@pytest.mark.engine("docker")
@pytest.mark.timeout(300)
def test_a_run_leaves_the_machines_docker0_alone(tmp_path: object) -> None:
    pid = os.getpid()
    ns = f"nccoex{pid % 100000}"
    env = {
        **os.environ,
        "ENGINES": ENGINES,
        "RECORD": f"{tmp_path}/record",
        "NETCUT_CI_RUN": f"/run/nc-coex-{pid}",
        "NETCUT_CI_DATA": f"/var/lib/nc-coex-{pid}",
        "NETCUT_CI_NAME": f"nccoex-{pid}",
        # bridges and subnets are the namespace's: the defaults, as on a machine of its own
        "NETCUT_CI_BRIDGES": "nc",
        "NETCUT_CI_NET": "250",
        # podman's machine-wide state is another test's (test_engines.py); the suite's own
        # run changes it meanwhile
        "NETCUT_MACHINE_PATHS": f"{tmp_path}/none",
    }
    for name in ("DOCKER_HOST", "CONTAINERD_ADDRESS", "CONTAINERS_CONF",
                 "CONTAINERS_STORAGE_CONF", "CONTAINERS_REGISTRIES_CONF"):  # fmt: skip
        env.pop(name, None)
    env["PATH"] = ":".join(p for p in env["PATH"].split(":") if not p.startswith("/run/"))
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        done = subprocess.run(
            ["nsenter", f"--net=/run/netns/{ns}", "bash", "-c", SCRIPT],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
    out = done.stdout
    assert "record: dirty" not in out, out + done.stderr
    assert "up: failed" not in out, out + done.stderr
    assert "after-up: docker0 172.17.0.1/16\n" in out, out + done.stderr
    assert "user-docker: ok" in out, out + done.stderr
    assert "after-down: docker0 172.17.0.1/16\n" in out, out + done.stderr
    assert "leftovers: none" in out, out + done.stderr
    for path in (env["NETCUT_CI_RUN"], env["NETCUT_CI_DATA"]):
        assert not os.path.exists(path), path

"""The helper through the Docker Engine API, on the real test dockerd, as the run's
docker-group user (tests/ciuser.py; docs/netcut.md#the-docker-engine-api).

The user's helper runs without the docker CLI; it holds exactly what the CLI's helper holds
(NET_ADMIN and NET_RAW, /proc/sys writable, the pass directory mounted); a cut and its restore
work through it; the session returns before the engine removed the container, which is gone
soon after (polled with a deadline); and `NETCUT_DOCKER_API=0` gives the CLI's helper, which
holds the same."""

from __future__ import annotations

import json
import time

import pytest
from enginelib import Box, sh

from ciuser import CiUser

pytestmark = [pytest.mark.engine("docker")]

# As the user: one helper session on container argv[1]; prints what it holds and which
# container ran it. /proc/self/status's CapEff, whether /proc/sys is writable, the mount.
SESSION = r"""
import json, sys, time
from netcut.helper.session import HelperExecutor
from netcut.helper.listeners import FdPass
with FdPass() as fdpass:
    ex = HelperExecutor("docker", sys.argv[1], None)
    ex.binds = (fdpass.bind(),)
    code, out = ex.send(
        'while read -r k v; do [ "$k" = CapEff: ] && echo "caps $v"; done </proc/self/status;'
        ' [ -w /proc/sys/net/ipv6/conf/all/accept_ra ] && echo "sysctl writable";'
        ' [ -d /netcut/pass ] && echo "pass mounted"'
    )
    helper = getattr(ex.proc, "id", "")
    t0 = time.monotonic()
    ex.close(wait=False)
    closed = time.monotonic() - t0
print(json.dumps({"transport": ex.transport, "runs": ex.runs, "code": code, "out": out,
                  "helper": helper, "close_s": closed}))
"""


def _session(ci_user: CiUser, box: Box, **env: str) -> dict[str, object]:
    done = ci_user.python(SESSION, box.name, env=env)
    assert done.returncode == 0, done.stderr
    data: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return data


def _gone(container: str, deadline_s: float = 15.0) -> bool:
    """Whether the engine stops knowing `container` before the deadline (polled)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        done = sh("docker", "container", "inspect", container, check=False)
        if done.returncode != 0 and "no such" in (done.stderr + done.stdout).lower():
            return True
    return False


def _holds(out: object) -> list[str]:
    return sorted(str(out).split("\n"))


HELD = ["", "caps 0000000000003000", "pass mounted", "sysctl writable"]  # NET_ADMIN|NET_RAW


def test_a_docker_group_users_helper_runs_through_the_api(ci_user: CiUser, make_box) -> None:
    box = make_box("docker")
    data = _session(ci_user, box)
    assert data["transport"] == "api"
    assert data["runs"] == 1
    assert data["code"] == 0
    assert _holds(data["out"]) == HELD
    helper = str(data["helper"])
    assert len(helper) == 64
    assert _gone(helper), f"helper container {helper} still there"


def test_the_cli_helper_holds_the_same(ci_user: CiUser, make_box) -> None:
    box = make_box("docker")
    data = _session(ci_user, box, NETCUT_DOCKER_API="0")
    assert data["transport"] == "cli"
    assert data["runs"] == 1
    assert data["code"] == 0
    assert _holds(data["out"]) == HELD


CUT = r"""
import json, sys, time, netcut
from netcut.helper import mode, session
made = []  # every helper session, to count its container runs and requests
init = session.HelperExecutor.__init__
def counted(self, *args, **kwargs):
    init(self, *args, **kwargs)
    made.append(self)
session.HelperExecutor.__init__ = counted
ref = netcut.container(sys.argv[1])
cut = mode.cut(ref)
st = mode.status(ref)
back = mode.restore(ref)
print(json.dumps({"cut": cut.status.state, "probe": cut.probe.ok, "status": st.state,
                  "restored": back.changed, "after": back.status.state,
                  "restore": [made[-1].runs, made[-1].requests]}))
"""


@pytest.mark.parametrize("api", ["1", "0"])
def test_cut_status_restore_through_either_path(
    ci_user: CiUser, ci_user_tmp, make_box, api: str
) -> None:
    box = make_box("docker")
    env = {"NETCUT_DOCKER_API": api, "NETCUT_STATE_DIR": str(ci_user_tmp)}
    done = ci_user.python(CUT, box.name, env=env)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout.strip().splitlines()[-1])
    assert data == {
        "cut": "cut",
        "probe": True,
        "status": "cut",
        "restored": True,
        "after": "not cut",
        # one container; its shell asked twice: the prelude with the namespace's identity,
        # then the record's undo (if the backstop is there) with the marks it left
        # (docs/netcut.md#helper-mode)
        "restore": [1, 2],
    }
    # nothing of the helpers is left: every container the engine knows is the box's
    full = sh("docker", "inspect", "--format", "{{.Id}}", box.name).stdout.strip()
    left = sh("docker", "ps", "-aq", "--filter", f"label=netcut.helper={full}").stdout
    assert all(_gone(c) for c in left.split())


def test_a_missing_container_is_told_as_the_cli_tells_it(ci_user: CiUser) -> None:
    done = ci_user.run(["netcut", "status", "--container", "nc-no-such-box", "--mode", "helper"])
    assert done.returncode != 0
    assert "No such container: nc-no-such-box" in done.stderr, done.stderr

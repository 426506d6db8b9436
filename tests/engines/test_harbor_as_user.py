"""A whole Harbor trial as a docker-group user (issue 30): Harbor 0.26's own trial entry
point (`harbor trials start`, in asuser_harbor.py) with its oracle agent, in
`EgressDockerEnvironment` with its default cut mode, run by the engine run's real user
`netcut-ci-user` (tests/ciuser.py: its uid, its groups, no capability) with Harbor's
Python 3.12 venv. Nothing of it runs as root, so netcut's automatic choice is the helper,
which the trial's log says, with why.

The task is an allowlist task on the run's user-defined docker network `nc-ci` (Docker's
embedded resolver 127.0.0.11 in `resolv.conf`), beside another container of that network:

- setup (the image build) reaches a host directly, before any cut;
- the agent phase, cut: the allowed host answers through the proxy (200), a blocked host gets
  the proxy's 403 (no address by name); a direct connection to an address outside the
  policy never reaches it; the other container's name resolves through none of the
  container's resolvers, and its port is unreachable;
- the verifier phase, released: the direct address, the other container and its name
  through 127.0.0.11 answer again (the restore is real);
- the audit log has the decisions, and `egress audit verify` passes on it, run as the user.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from enginelib import BOX, harbor_task_rootfs, sh
from frameworks.composeplugin import compose_config
from frameworks.harborvenv import harbor_venv
from test_boundary_engines import other_host

import ciuser
import harness
from servers import start_origin

pytestmark = [pytest.mark.netns, pytest.mark.engine("docker")]
HERE = Path(__file__).parent
DRIVER = HERE / "asuser_harbor.py"
NETWORK = "nc-ci"  # the run's user-defined docker network (tests/engines/up.sh)
PEER = "while true; do echo peer-says-hi | nc -l -p 7000; done"
NO_CAPS = "0000000000000000"
# What each attempt gave, on one line: the answer (whitespace folded) and the exit status.
# (busybox 1.35's static wget crashes with -T: the time limit is timeout's; no globbing,
# the answers are echoed unquoted)
SHELL = """#!/bin/sh
set -f
say() { out=$("$@" 2>&1); rc=$?; echo "$(echo $out) rc=$rc"; }
get() { say timeout 15 wget -q -O - "$@"; }
dns() { say timeout 15 nslookup "$1" "$2"; }
tcp() { say sh -c "echo hi | timeout 10 nc $1 $2"; }
"""


@pytest.fixture
def task_image() -> Iterator[str]:
    tag = f"egress-harbor-user-task:{os.getpid()}"
    image = harbor_task_rootfs()
    subprocess.run(["docker", "import", "-", tag], input=image, check=True, timeout=120,
                   capture_output=True)  # fmt: skip
    try:
        yield tag
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], check=False, capture_output=True)


class _Recorder(BaseHTTPRequestHandler):
    """Answers `{"path": PATH}` and records the path in its server's `seen`."""

    def do_GET(self) -> None:
        self.server.seen.append(self.path)  # type: ignore[attr-defined]
        body = json.dumps({"path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def outside_server(addr: str) -> Iterator[tuple[int, list[str]]]:
    """An HTTP server on `addr` in the root namespace (a host outside the policy that
    containers reach directly): its port and the paths it was asked for. Its accept waits
    at most a second, so shutdown never hangs (as test_boundary_engines.http_server)."""
    srv = ThreadingHTTPServer((addr, 0), _Recorder)
    srv.seen = []  # type: ignore[attr-defined]
    srv.socket.settimeout(1.0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv.server_address[1], srv.seen  # type: ignore[attr-defined]
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.fixture
def peer() -> Iterator[tuple[str, str]]:
    """Another container on the run's network, answering `peer-says-hi` on port 7000: its
    name (which Docker's embedded resolver answers) and its address."""
    name = f"nc-hu{os.getpid()}-peer"
    sh("docker", "run", "-d", "--rm", "--name", name, "--network", NETWORK, "--cap-drop", "ALL",
       BOX, "sh", "-c", PEER)  # fmt: skip
    try:
        fmt = "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}"
        yield name, sh("docker", "inspect", "--format", fmt, name).stdout.strip()
    finally:
        sh("docker", "rm", "-f", name, check=False)


def write_task(task: Path, image: str, direct: str, upstream: str, peer: tuple[str, str]) -> None:
    """An allowlist task on `NETWORK`: its build fetches `direct` (setup, online); its
    solution prints what each attempt of the agent phase gave; its tests, what the
    verifier phase (released) reaches."""
    name, address = peer
    for sub in ("environment", "solution", "tests"):
        (task / sub).mkdir(parents=True)
    (task / "task.toml").write_text(
        'schema_version = "1.4"\n[metadata]\n[verifier]\ntimeout_sec = 120.0\n'
        '[agent]\ntimeout_sec = 120.0\nnetwork_mode = "allowlist"\n'
        'allowed_hosts = ["allowed.test"]\n[environment]\nbuild_timeout_sec = 120.0\n'
    )
    (task / "instruction.md").write_text("Fetch http://allowed.test/agent.\n")
    (task / "environment" / "Dockerfile").write_text(
        f"FROM {image}\nRUN wget -q -O /setup.json http://{direct}/setup\nWORKDIR /app\n"
    )
    network = {"networks": {"default": {"name": NETWORK, "external": True}}}
    (task / "environment" / "docker-compose.yaml").write_text(json.dumps(network))
    (task / "solution" / "solve.sh").write_text(
        f"{SHELL}resolvers=$(sed -n 's/^nameserver[[:space:]]*//p' /etc/resolv.conf)\n"
        'echo "resolvers=$(echo $resolvers)"\n'
        'echo "allowed=$(get http://allowed.test/agent)"\n'
        'echo "blocked_by_name=$(get http://blocked.test/agent)"\n'
        f"echo \"blocked_by_address=$(get --header 'Host: blocked.test' http://{upstream}/agent)\"\n"
        f'echo "direct=$(get http://{direct}/direct)"\n'
        f'for ns in $resolvers; do echo "dns_$ns=$(dns {name} $ns)"; done\n'
        f'echo "peer=$(tcp {address} 7000)"\n'
        'echo "setup=$(cat /setup.json)"\n'
    )
    (task / "tests" / "test.sh").write_text(
        f"{SHELL}{{\n"
        f'echo "direct=$(get http://{direct}/verify)"\n'
        f'echo "dns=$(dns {name} 127.0.0.11)"\n'
        f'echo "peer=$(tcp {address} 7000)"\n'
        "} > /logs/verifier/restored.txt\necho 1 > /logs/verifier/reward.txt\n"
    )


def lines(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def user_config(config: Path, owner: ciuser.CiUser, into: Path) -> Path:
    """A copy of the Compose v2 client configuration the user owns (docker may write its
    configuration directory; the tests' own is root's)."""
    mine = into / "docker-config"
    plugin = mine / "cli-plugins" / "docker-compose"
    plugin.parent.mkdir(parents=True)
    shutil.copy2(config / "cli-plugins" / "docker-compose", plugin)
    for path in (mine, plugin.parent, plugin):
        os.chown(path, owner.uid, owner.gid)
    return mine


def user_dir(path: Path, owner: ciuser.CiUser) -> Path:
    path.mkdir(mode=0o700)
    os.chown(path, owner.uid, owner.gid)
    return path


@pytest.mark.timeout(900)
async def test_a_harbor_trial_as_a_docker_group_user(
    ci_user: ciuser.CiUser,
    ci_user_tmp: Path,
    test_host: harness.TestHost,
    tmp_path_factory: pytest.TempPathFactory,
    task_image: str,
    peer: tuple[str, str],
) -> None:
    venv = harbor_venv(tmp_path_factory.getbasetemp())
    python = str(venv / "bin" / "python")
    reach = ci_user.run([python, "-c", "import harbor, egress"])
    assert reach.returncode == 0, (
        f"the run's user cannot run Harbor's venv {venv}: tests/engines/up.sh grants it the "
        "way to EGRESS_HARBOR_VENV's interpreter, so export EGRESS_HARBOR_VENV before up.sh "
        f"(./dev.sh test does): {reach.stderr[-2000:]}"
    )
    config = user_config(compose_config(tmp_path_factory.getbasetemp()), ci_user, ci_user_tmp)
    trial_name = f"hu{os.getpid()}"
    task = ci_user_tmp / f"user-trial-{os.getpid()}"
    audit = ci_user_tmp / "audit.jsonl"
    upstream = test_host.addr_ns
    origin = await start_origin(test_host, 80)  # allowed.test and blocked.test, pinned
    with other_host() as other, outside_server(other) as (port, outside):
        direct = f"{other}:{port}"
        write_task(task, task_image, direct, upstream, peer)
        for top, dirs, files in os.walk(task):
            for path in (top, *(os.path.join(top, n) for n in dirs + files)):
                os.chown(path, ci_user.uid, ci_user.gid)
        # (no NETCUT_STATE_DIR: netcut's default for a user, $XDG_RUNTIME_DIR/netcut)
        env = {
            "DOCKER_CONFIG": str(config),
            "EGRESS_AUDIT": str(audit),
            "EGRESS_RESOLVE": f"allowed.test={upstream},blocked.test={upstream}",
        }
        classes = user_dir(ci_user_tmp / "classes", ci_user)
        argv = [
            python, str(DRIVER), str(classes),
            "trials", "start", "-p", str(task), "--agent", "oracle",
            "--env", "egress.integrations.harbor:EgressDockerEnvironment",
            "--trials-dir", str(ci_user_tmp / "trials"), "--trial-name", trial_name,
        ]  # fmt: skip
        try:  # (in a thread: the origins answer on this loop meanwhile)
            done = await asyncio.to_thread(
                ci_user.run, argv, env=env, cwd=str(ci_user_tmp), timeout=800
            )
        finally:
            await origin.close()
    said = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            step = json.loads(line)
            said[step.pop("step")] = step
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-5000:])

    # the trial process: the user's ids and groups, no capability, before and after
    for when in ("before", "after"):
        seen = said[when]
        assert seen["uid"] == seen["euid"] == ci_user.uid, seen
        assert seen["gid"] == ci_user.gid, seen
        assert ci_user.group_gid in seen["groups"], seen  # the docker socket's group
        assert 0 not in seen["groups"], seen
        assert seen["CapEff"] == seen["CapPrm"] == seen["CapAmb"] == NO_CAPS, seen
    assert said["after"]["code"] == 0
    assert "egress-docker cut_mode" in said["classes"]["bad"]
    assert "egress-namespace needs root" in said["classes"]["namespace"]

    trial = ci_user_tmp / "trials" / trial_name
    result = json.loads((trial / "result.json").read_text())
    assert result["exception_info"] is None, result["exception_info"]
    assert result["verifier_result"]["rewards"]["reward"] == 1
    # netcut's automatic choice, said in the trial's log: the helper, and why
    log = (trial / "trial.log").read_text()
    cuts = [line for line in log.splitlines() if "egress: docker:" in line]
    assert len(cuts) == 1, log[-3000:]
    assert "cut for allowlist in helper mode" in cuts[0], cuts
    assert "lacks CAP_SYS_ADMIN" in cuts[0], cuts

    agent = lines((trial / "agent" / "oracle.txt").read_text())
    address = peer[1]
    assert json.loads(agent["setup"])["path"] == "/setup"  # the build, online
    assert "127.0.0.11" in agent["resolvers"].split(), agent  # a user-defined network's
    assert agent["allowed"].endswith(" rc=0"), agent
    assert json.loads(agent["allowed"].removesuffix(" rc=0"))["path"] == "/agent"
    assert "bad address 'blocked.test'" in agent["blocked_by_name"], agent
    assert "403" in agent["blocked_by_address"], agent
    # (a port other than 80 and 443: the proxy judges the address and resets the connection)
    assert not agent["direct"].endswith(" rc=0"), agent
    assert "/direct" not in agent["direct"], agent
    for resolver in agent["resolvers"].split():
        answer = agent[f"dns_{resolver}"]
        assert address not in answer, (resolver, answer)
        assert not answer.endswith(" rc=0"), (resolver, answer)
    assert "peer-says-hi" not in agent["peer"], agent
    # what reached the upstream and the address outside the policy, in order
    assert [s.path for s in origin.seen] == ["/agent"]
    assert outside == ["/setup", "/verify"]

    # released: the verifier phase reaches what the agent could not
    restored = lines((trial / "verifier" / "restored.txt").read_text())
    assert json.loads(restored["direct"].removesuffix(" rc=0"))["path"] == "/verify"
    assert address in restored["dns"], restored
    assert restored["dns"].endswith(" rc=0"), restored
    assert restored["peer"] == "peer-says-hi rc=0", restored

    records = [json.loads(x) for x in audit.read_text().splitlines() if x.strip()]
    decided = {(r.get("host"), r.get("method"), r.get("decision")) for r in records}
    assert ("allowed.test", "GET", "allow") in decided, decided
    assert ("blocked.test", "GET", "block") in decided, decided
    assert ("blocked.test", "DNS", "block") in decided, decided
    # DNS to 127.0.0.11 reached egress's responder, never Docker's; raw TCP, the proxy
    assert (peer[0], "DNS", "block") in decided, decided
    assert (other, "CONNECT", "block") in decided, decided
    assert (address, "CONNECT", "block") in decided, decided
    verified = ci_user.run(["egress", "audit", "verify", str(audit)])
    assert verified.returncode == 0, verified.stdout + verified.stderr
    project = f"label=com.docker.compose.project={trial_name}__env"
    assert sh("docker", "ps", "-aq", "--filter", project).stdout.split() == []

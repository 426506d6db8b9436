"""Run in verifiers' venv by test_verifiers_connect_port.py: the CONNECT-port decision of
each runtime's policy, by default and with the `any_connect_port` opt-in (keyword, the
namespace config's field, `$EGRESS_VERIFIERS_ANY_CONNECT_PORT`). One JSON line."""

from __future__ import annotations

import json
import os

from verifiers.v1.runtimes.docker import DockerConfig

from egress.integrations.verifiers import ANY_CONNECT_PORT_ENV, EgressDockerRuntime
from egress.integrations.vf_runtime import NamespaceConfig, NamespaceRuntime
from egress.policy.target import make_target


def connect(runtime: object, port: int) -> bool:
    policy = runtime.egress.policy  # type: ignore[attr-defined]
    return bool(policy.decide(make_target("https", "a.test", port)).allowed)


def main() -> None:
    docker = DockerConfig(allow=["a.test"])
    wide = NamespaceConfig(allow=["a.test"], any_connect_port=True)
    said: dict[str, object] = {}
    for name, runtime in [
        ("docker-default", EgressDockerRuntime(docker)),
        ("docker-opt-in", EgressDockerRuntime(docker, any_connect_port=True)),
        ("namespace-default", NamespaceRuntime(NamespaceConfig(allow=["a.test"]))),
        ("namespace-field", NamespaceRuntime(wide)),
    ]:
        said[name] = [connect(runtime, 443), connect(runtime, 8443)]
    os.environ[ANY_CONNECT_PORT_ENV] = "1"
    said["docker-env"] = [connect(EgressDockerRuntime(docker), p) for p in (443, 8443)]
    said["docker-env-keyword-off"] = [
        connect(EgressDockerRuntime(docker, any_connect_port=False), p) for p in (443, 8443)
    ]
    os.environ[ANY_CONNECT_PORT_ENV] = "yes"
    try:
        EgressDockerRuntime(docker)
        said["env-typo"] = "accepted"
    except ValueError as exc:
        said["env-typo"] = str(exc)
    print(json.dumps(said))


if __name__ == "__main__":
    main()

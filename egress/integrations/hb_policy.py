"""Harbor's network policy as egress enforces it, without importing Harbor
(docs/integrations.md#harbor): what `egress.integrations.harbor` (Harbor's own environments)
and `egress.integrations.hb_inspect` (Harbor tasks run by inspect-harbor, where Harbor
itself is not installed) share.

- `phase_policy`: the `Policy` one phase runs under (`from_harbor`, framework routes, the
  evaluator composed over it);
- `HarborEgress`: one sandbox's policy, switched per phase (`apply`), released at the end;
- `shared_namespace_override`: the compose layout of Harbor's sidecar mode, with an idle
  holder in the sidecar's place, so that cutting one namespace cuts every service.

A policy is Harbor's `NetworkPolicy` or its `model_dump()` (`network_mode`,
`allowed_hosts`): the same fields in the same spelling.
"""

from __future__ import annotations

import ipaddress
import logging
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from netcut.helper import image as helper_image

from ..boundary import Execution, prepare_execution, release_execution
from ..errors import EgressError
from ..policy.compose import compose, from_harbor
from ..policy.rules import Policy, parse_framework_route
from ..proxy.server import EgressProxy
from ..proxy.telemetry.observe import ExecutionSummary
from .shared import EvaluatorFile, shared_proxy

PUBLIC = "public"


def policy_fields(network_policy: object) -> dict[str, object]:
    """A Harbor policy's fields: a `NetworkPolicy` (anything with `model_dump`) dumped as
    JSON, or a mapping copied. Pure."""
    dump = getattr(network_policy, "model_dump", None)
    if callable(dump):
        return dict(dump(mode="json"))
    if isinstance(network_policy, Mapping):
        return dict(network_policy)
    raise TypeError(
        f"a Harbor network policy is a NetworkPolicy or a mapping, not {network_policy!r}"
    )


def network_mode(network_policy: object) -> str:
    """The policy's `network_mode` as Harbor spells it (`public`, `allowlist`,
    `no-network`; an enum member gives its value). Pure."""
    mode = policy_fields(network_policy).get("network_mode", PUBLIC)
    return str(getattr(mode, "value", mode))


def phase_policy(
    network_policy: object,
    framework_routes: Iterable[str] = (),
    evaluator: Policy | None = None,
) -> Policy:
    """The `Policy` one Harbor phase runs under. Pure.

    `allowed_hosts` entries naming a framework route's host are left to the route (exact
    host and port); the rest map through `from_harbor`; an `evaluator` policy, if any, is
    composed over the task's (`egress.compose`). Raises `PolicyError` as `from_harbor`."""
    fields = policy_fields(network_policy)
    route_hosts = {parse_framework_route(r).host for r in framework_routes}
    hosts = fields.get("allowed_hosts") or []
    if isinstance(hosts, list) and route_hosts:
        fields["allowed_hosts"] = [h for h in hosts if str(h).strip().lower() not in route_hosts]
    task = from_harbor(fields)
    return compose(evaluator, task) if evaluator is not None else task


class HarborEgress:
    """One sandbox's Harbor network policy, enforced by egress: `apply` per phase, `close`
    when the environment stops. The proxy is `proxy`, else the loop's `egress.shared_proxy()`;
    `client_id` names the sandbox in the audit log (Harbor's session id, by default).
    Each cut is logged to `logger` (the environment's, which Harbor writes to the trial's
    `trial.log`) with the cut mode netcut used and why (docs/integrations.md#harbor)."""

    def __init__(
        self,
        sandbox: str,
        client_id: str,
        *,
        evaluator: Policy | EvaluatorFile | None = None,
        framework_routes: Sequence[str] = (),
        proxy: EgressProxy | None = None,
        prepare_args: dict[str, Any] | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        self.sandbox = sandbox
        self.client_id = client_id
        self.file = evaluator if isinstance(evaluator, EvaluatorFile) else None
        self.evaluator: Policy | None = (
            evaluator.policy if isinstance(evaluator, EvaluatorFile) else evaluator
        )
        self.framework_routes = list(framework_routes)
        self.prepare_args = dict(prepare_args or {})
        self.execution: Execution | None = None
        self.summaries: list[ExecutionSummary] = []
        self._proxy = proxy
        self.logger = logger or logging.getLogger(__name__)

    async def proxy(self) -> EgressProxy:
        """The proxy, with the evaluator file's pins and reserved networks added (once)."""
        if self._proxy is None:
            proxy = await shared_proxy()
            if self.file is not None:
                self.file.apply_to(proxy)
            self._proxy = proxy
        return self._proxy

    async def apply(self, network_policy: object) -> None:
        """Enforce `network_policy` now. Raises `PolicyError` for a policy that cannot be
        enforced exactly and `ExecutionNotReady` when the cut cannot be proven (the sandbox
        then stays cut: fail closed); Harbor fails the trial either way."""
        if network_mode(network_policy) == PUBLIC:
            await self.release()
            return
        policy = phase_policy(network_policy, self.framework_routes, self.evaluator)
        self.execution = await prepare_execution(
            self.sandbox,
            policy,
            await self.proxy(),
            framework_routes=self.framework_routes,
            client_id=self.client_id,
            transparent=True,
            **self.prepare_args,
        )
        self.logger.info(
            "egress: %s cut for %s in %s mode (%s)",
            self.sandbox,
            network_mode(network_policy),
            self.execution.cut_mode,
            self.execution.cut_mode_reason,
        )

    async def release(self) -> None:
        """Undo the cut, if there is one (`ReleaseFailed` if the restore fails)."""
        execution, self.execution = self.execution, None
        if execution is not None:
            summary = await release_execution(await self.proxy(), execution, restore=True)
            self.summaries.append(summary)

    close = release


# The compose service whose network namespace every policed service of the task shares
# (docs/integrations.md#every-service-of-the-task): in Harbor's own sidecar mode that is
# its gost sidecar; here an idle container of netcut's helper image, which holds no
# capability and runs nothing but a wait.
NETNS_SERVICE = "egress-netns"
_HOLDER_WAIT = ["/netcut/bin/python3", "-I", "-S", "-c", "import _signal; _signal.pause()"]
# what a process in a cut namespace must not hold (netcut refuses to cut otherwise)
_DROPPED = ["NET_ADMIN", "NET_RAW", "SYS_ADMIN"]


def shared_namespace_override(services: Sequence[str], holder_image: str) -> dict[str, Any]:
    """The compose override that puts `services` in one network namespace, held by
    `NETNS_SERVICE`: the layout Harbor's sidecar mode gives a task (every service without
    networking of its own shares the sidecar's namespace and reaches the others on
    `localhost`), with the holder in the sidecar's place. Cutting the holder's namespace
    then cuts every one of them. Pure.

    Raises `ValueError` when the task already has a service named `NETNS_SERVICE`."""
    if NETNS_SERVICE in services:
        raise ValueError(
            f"the task defines a compose service named {NETNS_SERVICE!r}, which egress-docker "
            "uses for the namespace its services share: rename it"
        )
    override: dict[str, Any] = {
        NETNS_SERVICE: {
            "image": holder_image,
            "pull_policy": "never",
            "entrypoint": _HOLDER_WAIT,
            "cap_drop": ["ALL"],
            "stop_signal": "SIGKILL",
        }
    }
    for name in services:
        override[name] = {
            "network_mode": f"service:{NETNS_SERVICE}",
            "depends_on": {NETNS_SERVICE: {"condition": "service_started"}},
            "cap_drop": list(_DROPPED),
        }
    return {"services": override}


def ensure_image(engine: str, tag: str) -> None:
    """`tag` present in `engine`, else assembled offline from this host's files (netcut's
    helper image: no registry is asked)."""
    found = subprocess.run(
        [engine, "image", "inspect", tag], capture_output=True, timeout=60, check=False
    )
    if found.returncode != 0:
        helper_image.build(engine, tag)


class HarborTaskError(EgressError):
    """A Harbor task (its `harbor_config` or its compose project) that egress cannot run
    behind its policy exactly: the message names the key and what to change. Raised before
    anything starts, so nothing runs unpoliced."""


@dataclass(frozen=True)
class HarborPhases:
    """The policies of one Harbor trial, as Harbor 0.26 resolves them for a single-step task
    with the verifier in the agent's environment (`harbor.trial.network_policy`): the
    `[environment]` baseline (from start, and between phases), the agent phase (`[agent]`'s
    own `network_mode`, else the baseline) and the verifier phase (`[verifier]`'s, else the
    baseline). Each is `{"network_mode": ..., "allowed_hosts": [...]}`."""

    baseline: dict[str, object]
    agent: dict[str, object]
    verifier: dict[str, object]

    @property
    def restricted(self) -> bool:
        """Some phase is not `public`: Harbor's own rule for starting its sidecar."""
        return any(network_mode(p) != PUBLIC for p in (self.baseline, self.agent, self.verifier))


def harbor_phases(harbor_config: Mapping[str, Any]) -> HarborPhases:
    """The phases of a task config (Harbor's `TaskConfig`, or inspect-harbor's, dumped:
    the same `[environment]`, `[agent]`, `[verifier]` fields). Pure.

    Raises `HarborTaskError` for what this resolution does not cover: multi-step tasks
    (`steps`) and a verifier in an environment of its own (`[verifier] environment_mode =
    "separate"` or `[verifier.environment]`), whose policies Harbor resolves per step or
    from that other environment."""
    if not isinstance(harbor_config, Mapping):
        raise HarborTaskError(f"harbor_config is a task config mapping, not {harbor_config!r}")
    if harbor_config.get("steps"):
        raise HarborTaskError(
            "harbor_config `steps`: a multi-step task's policies are per step; egress runs "
            "single-step Harbor tasks only (run it with Harbor's own CLI)"
        )
    env = _section(harbor_config, "environment")
    agent = _section(harbor_config, "agent")
    verifier = _section(harbor_config, "verifier")
    mode = verifier.get("environment_mode")
    if str(getattr(mode, "value", mode)) == "separate" or verifier.get("environment"):
        raise HarborTaskError(
            "harbor_config `[verifier] environment_mode = separate`: the verifier's own "
            "environment has a baseline of its own, which egress does not resolve; use the "
            "shared verifier or Harbor's own CLI"
        )
    baseline = _policy(env.get("network_mode") or PUBLIC, env.get("allowed_hosts"))

    def phase(section: Mapping[str, Any]) -> dict[str, object]:
        if section.get("network_mode") is None:
            return dict(baseline)
        return _policy(section["network_mode"], section.get("allowed_hosts"))

    return HarborPhases(baseline, phase(agent), phase(verifier))


def _section(config: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    section = config.get(key) or {}
    if not isinstance(section, Mapping):
        raise HarborTaskError(f"harbor_config `[{key}]` is a table, not {section!r}")
    return section


def _policy(mode: object, hosts: object) -> dict[str, object]:
    if hosts is not None and not isinstance(hosts, list | tuple):
        raise HarborTaskError(f"harbor_config `allowed_hosts` is a list, not {hosts!r}")
    for entry in hosts or ():
        if _is_ipv6(entry):
            # what Harbor itself refuses before start on egress's environments
            # (NETWORK_CAPABILITIES): a cut sandbox has no IPv6 at all
            raise HarborTaskError(
                f"harbor_config `allowed_hosts` entry {entry!r}: IPv6 addresses and ranges "
                "cannot be honoured (a cut sandbox has no IPv6); allow an IPv4 address or a name"
            )
    return {"network_mode": str(getattr(mode, "value", mode)), "allowed_hosts": list(hosts or ())}


def _is_ipv6(entry: object) -> bool:
    text = str(entry).strip().strip("[]")
    try:
        return ipaddress.ip_network(text, strict=False).version == 6
    except ValueError:
        return False


# a compose service's keys that would put it outside the shared namespace, or give a process
# in it what could undo the cut: each refused by name
# (docs/integrations.md#harbor-tasks-through-inspect-harbor)
_OWN_NETWORK_KEYS = ("networks", "ports", "extra_hosts", "hostname", "dns", "mac_address")
_UNDOING_CAPS = {"ALL", "NET_ADMIN", "NET_RAW", "SYS_ADMIN"}


def police_compose(project: Mapping[str, Any], holder_image: str) -> dict[str, Any]:
    """A compose project (as `docker compose` reads it) with every service in the holder's
    namespace (`shared_namespace_override`, merged in), so that cutting the holder puts every
    service behind the policy. Pure.

    Raises `HarborTaskError` naming the service and key for what egress cannot honour: a
    service with networking of its own (`networks`, a `network_mode` other than `bridge` or
    `none`, published `ports`, `extra_hosts`, `hostname`...), `privileged`, or `cap_add` of
    a capability that could undo the cut."""
    services = project.get("services")
    if not isinstance(services, Mapping) or not services:
        raise HarborTaskError("the compose config has no `services`")
    for name, service in services.items():
        _check_service(str(name), service)
    try:
        override = shared_namespace_override(list(services), holder_image)["services"]
    except ValueError as exc:
        raise HarborTaskError(str(exc)) from exc
    merged: dict[str, Any] = {k: v for k, v in project.items() if k != "services"}
    merged["services"] = {NETNS_SERVICE: override[NETNS_SERVICE]}
    for name, service in services.items():
        mine = override[name]
        out = {k: v for k, v in service.items() if k != "network_mode"}
        out["network_mode"] = mine["network_mode"]
        out["cap_drop"] = sorted({*(service.get("cap_drop") or []), *mine["cap_drop"]})
        depends = service.get("depends_on") or {}
        if isinstance(depends, list):
            depends = {d: {"condition": "service_started"} for d in depends}
        out["depends_on"] = {**depends, **mine["depends_on"]}
        merged["services"][name] = out
    return merged


def _check_service(name: str, service: object) -> None:
    if not isinstance(service, Mapping):
        raise HarborTaskError(f"compose service {name!r} is a mapping, not {service!r}")
    for key in _OWN_NETWORK_KEYS:
        if service.get(key):
            raise HarborTaskError(
                f"compose service {name!r} sets `{key}`: egress puts every service of a "
                "restricted Harbor task in one cut namespace, where a service has no "
                f"networking of its own; remove `{key}` from the task's docker-compose.yaml"
            )
    mode = service.get("network_mode")
    if mode not in (None, "bridge", "none"):
        raise HarborTaskError(
            f"compose service {name!r} sets `network_mode: {mode}`: egress puts every service "
            "of a restricted Harbor task in one cut namespace; remove it"
        )
    if service.get("privileged"):
        raise HarborTaskError(
            f"compose service {name!r} is `privileged`: a privileged process could undo the "
            "cut; remove it"
        )
    for key in ("cap_add", "cap_drop"):
        value = service.get(key)
        if value is not None and not (
            isinstance(value, list) and all(isinstance(c, str) for c in value)
        ):
            raise HarborTaskError(f"compose service {name!r}: `{key}` is a list of names")
    depends = service.get("depends_on")
    if depends is not None and not (
        isinstance(depends, Mapping)
        or (isinstance(depends, list) and all(isinstance(d, str) for d in depends))
    ):
        raise HarborTaskError(f"compose service {name!r}: `depends_on` is a list or a mapping")
    caps = {c.upper().removeprefix("CAP_") for c in service.get("cap_add") or []}
    if caps & _UNDOING_CAPS:
        raise HarborTaskError(
            f"compose service {name!r} adds `cap_add: {sorted(caps & _UNDOING_CAPS)}`: a "
            "process holding it could undo the cut; remove it"
        )


__all__ = [
    "NETNS_SERVICE",
    "HarborEgress",
    "HarborPhases",
    "HarborTaskError",
    "ensure_image",
    "harbor_phases",
    "network_mode",
    "phase_policy",
    "police_compose",
    "policy_fields",
    "shared_namespace_override",
]

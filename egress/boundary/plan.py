"""The agent's environment and framework URLs, known before the cut (docs/integrations.md).

Frameworks build the agent's command line, its config files and its base URLs while setting
a sandbox up, before the cut that `prepare_execution` makes. `plan_execution` answers, from
the same arguments, what that `Execution` will hand out, so they can be written in first;
`ExecutionPlan.holds(execution)` then says whether the prepared sandbox kept to it (a
forwarder whose port was taken inside the sandbox moves to another one, docs/proxy.md#
listening-inside-a-namespace-framework-route-forwarders). Pure.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..policy.rules import parse_framework_route
from ..validate import as_count, as_str, as_str_list
from .execution import Execution, agent_env, route_url

_ID_CHARS = re.compile(r"[^A-Za-z0-9._-]+")
MAX_CLIENT_ID = 64


def client_id_from(*parts: object) -> str:
    """A client id from a framework's run, sample or trial id (and e.g. an epoch), joined by
    `-`: any character that could not stand in a proxy URL's userinfo or an audit query
    becomes `-`, at most 64 characters (the tail, which is the most specific, is kept).
    Raises ValueError when nothing is left."""
    text = "-".join(_ID_CHARS.sub("-", str(p)).strip("-") for p in parts if str(p))
    text = text.strip("-")[-MAX_CLIENT_ID:].lstrip("-")
    if not text:
        raise ValueError(f"client_id_from: no usable characters in {parts!r}")
    return text


@dataclass(frozen=True)
class ExecutionPlan:
    """What `prepare_execution` (loopback mode) will hand the agent, computed beforehand."""

    client_id: str
    token: str
    proxy_port: int
    proxy_url: str
    env: Mapping[str, str]
    framework_urls: Mapping[str, str]

    def holds(self, execution: Execution) -> bool:
        """Did the prepared `execution` keep to this plan (same proxy URL and route URLs)?"""
        return execution.proxy_url == self.proxy_url and dict(execution.framework_urls) == dict(
            self.framework_urls
        )


def plan_execution(
    client_id: str,
    *,
    framework_routes: Iterable[str] = (),
    proxy_port: int = 3128,
    token: str | None = None,
) -> ExecutionPlan:
    """The environment and framework URLs a loopback-mode `prepare_execution` with these
    arguments hands out (pass it `client_id=plan.client_id, token=plan.token,
    proxy_port=plan.proxy_port`): the proxy on the sandbox's 127.0.0.1:`proxy_port`, each
    route on the sandbox's 127.0.0.1 at the route's own port."""
    cid = as_str(client_id, "plan_execution client_id")
    port = as_count(proxy_port, "plan_execution proxy_port", minimum=1)
    tok = as_str(token, "plan_execution token") if token is not None else None
    tok = tok or secrets.token_urlsafe(24)
    routes = [
        parse_framework_route(r)
        for r in as_str_list(framework_routes, "plan_execution framework_routes")
    ]
    proxy_url = f"http://{cid}:{tok}@127.0.0.1:{port}"
    urls = {r.text: route_url(r, "127.0.0.1", r.port) for r in routes}
    env = agent_env(proxy_url, ["localhost", "127.0.0.1", "::1"])
    return ExecutionPlan(cid, tok, port, proxy_url, env, urls)

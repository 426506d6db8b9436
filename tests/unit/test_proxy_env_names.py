"""The agent's environment names the proxy in every client's convention (issue 31;
docs/clients.md#the-agents-environment): every scheme's variable in both cases, aiohttp's
per-scheme `WS_PROXY` / `WSS_PROXY` included, `NO_PROXY` once per entry, Node's switch. The
clients themselves are tested in tests/integration/test_agent_env.py."""

from __future__ import annotations

from egress import plan_execution
from egress.boundary import PROXY_ENV, agent_env


def test_every_scheme_and_case_names_the_proxy() -> None:
    env = agent_env("http://c:t@127.0.0.1:3128", ["localhost", "localhost"])
    for name in (*PROXY_ENV, "WS_PROXY", "WSS_PROXY", "ALL_PROXY"):
        assert env[name] == env[name.lower()] == "http://c:t@127.0.0.1:3128"
    assert env["NO_PROXY"] == env["no_proxy"] == "localhost"
    assert env["NODE_USE_ENV_PROXY"] == "1"


def test_the_plan_hands_out_the_same_environment() -> None:
    plan = plan_execution("vf-1", token="t")
    assert plan.env["WSS_PROXY"] == plan.env["wss_proxy"] == "http://vf-1:t@127.0.0.1:3128"
    assert plan.env == agent_env(plan.proxy_url, ["localhost", "127.0.0.1", "::1"])

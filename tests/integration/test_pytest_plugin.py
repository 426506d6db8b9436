"""The project's own use of its pytest plugin's fixtures (egress.pytest_plugin)."""

from __future__ import annotations

import subprocess

import pytest

from egress import Policy
from egress.pytest_plugin import Namespace, ProxyHandle, Upstream

from servers import run


@pytest.fixture
def egress_policy() -> Policy:
    return Policy(allow=["upstream.test"], block=["evil.test"])


def curl(proxy: str, url: str) -> str:
    argv = [
        "curl",
        "-sS",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "--max-time",
        "5",
        "-x",
        proxy,
        url,
    ]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    return out.stdout


@pytest.mark.userns
def test_proxy_and_pinned_upstream(egress_proxy: ProxyHandle, egress_upstream: Upstream) -> None:
    assert curl(egress_proxy.url, egress_upstream.url + "hello") == "200"
    assert egress_upstream.seen == ["/hello"]
    record = egress_proxy.wait_for(host="upstream.test", decision="allow")
    assert record["addr"] == egress_upstream.addr
    assert curl(egress_proxy.url, "http://evil.test/?token=x") == "403"
    blocked = egress_proxy.wait_for(host="evil.test")
    assert blocked["reason"] == "block_rule"
    assert blocked["path"] == "/?REDACTED"  # fixtures see redacted records


@pytest.mark.userns
async def test_fixtures_work_from_async_tests(
    egress_proxy: ProxyHandle, egress_upstream: Upstream
) -> None:
    rc, out, err = await run(
        "curl", "-sS", "--max-time", "5", "-x", egress_proxy.url, egress_upstream.url
    )
    assert rc == 0, err
    assert '"server": "upstream"' in out


@pytest.mark.userns
def test_sandbox_reaches_the_upstream_only_through_the_proxy(
    egress_proxy: ProxyHandle, egress_upstream: Upstream, egress_sandbox: Namespace
) -> None:
    # the fixture itself, not only its name (issue 22: it failed given the fixture)
    listener = egress_proxy.listen_in(egress_sandbox, "127.0.0.1:0")
    assert listener.netns == egress_sandbox.name == str(egress_sandbox)
    inside = f"http://127.0.0.1:{listener.port}"
    direct = egress_sandbox.exec(
        "curl", "-sS", "--max-time", "2", f"http://{egress_upstream.addr}/"
    )
    assert direct.returncode != 0  # no route out of the sandbox
    via = egress_sandbox.exec("curl", "-sS", "--max-time", "5", "-x", inside, egress_upstream.url)
    assert via.returncode == 0, via.stderr
    assert egress_proxy.find(host="upstream.test", decision="allow")


def test_the_plugin_declares_what_async_tests_need() -> None:
    """Async tests need pytest-asyncio: the plugin says so, and an extra installs it."""
    import tomllib
    from pathlib import Path

    import egress.pytest_plugin

    assert "pytest-asyncio" in (egress.pytest_plugin.__doc__ or "")
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    extra = project["project"]["optional-dependencies"]["pytest"]
    assert any(req.startswith("pytest-asyncio") for req in extra)
    docs = (Path(__file__).parents[2] / "docs" / "testing.md").read_text()
    assert "pytest-asyncio" in docs
    for page in ("README.md", "docs/user-guide.md"):  # docs/testing.md is reachable
        assert "testing.md" in (Path(__file__).parents[2] / page).read_text(), page

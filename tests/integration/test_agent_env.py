"""The agent's environment reaches the proxy for every client convention (issue 31).

aiohttp picks its proxy variable by the URL's scheme: `ws_connect("wss://…")` with
`trust_env=True` reads `WSS_PROXY` and ignores `HTTPS_PROXY`, so before `prepare_execution`
set it the agent's WebSocket dialled directly and failed in the cut sandbox. Here real
clients in a cut sandbox get nothing but `execution.env` (plus PATH and the test CA), and no
proxy argument: aiohttp's `ws_connect` over wss:// and ws://.

Runs in a user namespace of its own (docs/testing.md#which-tests-need-root). Topology:
`sandbox` and `upstream` are test hosts; the proxy in this process reaches the
upstream's WebSocket echo server (TLS on 443, plain on 80) over its own veth.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import WSMsgType, web

from egress import EgressProxy, Policy, build_settings, prepare_execution, release_execution
from egress.proxy.net.netns import listen_in_netns

import harness
import userns
from proxykit import MemoryAudit
from servers import run

pytestmark = pytest.mark.userns

AGENT = userns.CAPLESS

# Runs in the sandbox: one WebSocket round trip, configured by the environment alone.
CLIENT = r"""
import asyncio, json, sys

async def with_aiohttp(url):
    import aiohttp
    async with aiohttp.ClientSession(trust_env=True) as session:
        try:
            async with session.ws_connect(url, timeout=aiohttp.ClientWSTimeout(ws_close=5)) as ws:
                await ws.send_str("ping")
                return {"echo": (await ws.receive(timeout=5)).data}
        except aiohttp.WSServerHandshakeError as exc:
            return {"status": exc.status}
        except aiohttp.ClientHttpProxyError as exc:
            return {"status": exc.status}
        except OSError as exc:
            return {"error": type(exc).__name__}

print(json.dumps(asyncio.run(with_aiohttp(sys.argv[1]))))
"""


@dataclass
class Scene:
    sandbox: harness.TestHost
    proxy: EgressProxy
    audit: MemoryAudit
    env: dict[str, str]


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    d = tmp_path_factory.mktemp("ws-tls")
    key, crt = str(d / "key.pem"), str(d / "crt.pem")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", key, "-out", crt, "-days", "2", "-subj", "/CN=ws.test",
         "-addext", "subjectAltName=DNS:ws.test,DNS:blocked.test"],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    Path(d).chmod(0o755)
    return crt, key


async def start_ws_echo(host: harness.TestHost, cert: tuple[str, str]) -> web.AppRunner:
    """A WebSocket echo server on `host`: TLS on 443, plain on 80."""

    async def echo(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for msg in ws:
            if msg.type == WSMsgType.TEXT:
                await ws.send_str("echo:" + msg.data)
        return ws

    app = web.Application()
    app.router.add_get("/{tail:.*}", echo)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(*cert)
    await web.SockSite(runner, listen_in_netns(host.ns, host.addr_ns, 443), ssl_context=ctx).start()
    await web.SockSite(runner, listen_in_netns(host.ns, host.addr_ns, 80)).start()
    return runner


@pytest.fixture
async def scene(test_host_factory: object, cert: tuple[str, str]) -> AsyncIterator[Scene]:
    sandbox = test_host_factory()  # type: ignore[operator]
    upstream = test_host_factory()  # type: ignore[operator]
    runner = await start_ws_echo(upstream, cert)
    up = upstream.addr_ns
    audit = MemoryAudit()
    settings = build_settings({}, resolve=[f"ws.test={up}", f"blocked.test={up}"])
    proxy = EgressProxy(settings, listen=["127.0.0.1:0"], audit=audit)
    await proxy.start()
    policy = Policy(allow=["ws.test", "ws.test:80"], block=["blocked.test"])
    try:
        execution = await prepare_execution(sandbox.ns, policy, proxy)
        env = {**execution.env, "PATH": "/usr/bin:/bin", "SSL_CERT_FILE": cert[0]}
        yield Scene(sandbox, proxy, audit, env)
        await release_execution(proxy, execution, restore=True)
    finally:
        await proxy.stop()
        await runner.cleanup()


async def ws_client(scene: Scene, url: str) -> dict[str, object]:
    envargs = [f"{k}={v}" for k, v in scene.env.items()]
    rc, out, err = await run(
        "ip", "netns", "exec", scene.sandbox.ns, "env", "-i", *envargs, *AGENT,
        sys.executable, "-c", CLIENT, url,
    )  # fmt: skip
    assert rc == 0, err
    result: dict[str, object] = json.loads(out)
    return result


async def test_aiohttp_wss_from_the_environment_alone(scene: Scene) -> None:
    assert await ws_client(scene, "wss://ws.test/chat") == {"echo": "echo:ping"}
    assert scene.audit.find(method="CONNECT", host="ws.test", port=443, decision="allow")
    # refused: the CONNECT's 403, recorded as a block
    assert await ws_client(scene, "wss://blocked.test/chat") == {"status": 403}
    record = await scene.audit.wait_for(method="CONNECT", host="blocked.test")
    assert record["reason"] == "block_rule"


async def test_aiohttp_ws_from_the_environment_is_judged_by_the_proxy(scene: Scene) -> None:
    # aiohttp sends ws:// in absolute form: the proxy judges the name, refuses the blocked
    # host with its reason and any other with the documented 400 (docs/proxy.md#websocket);
    # either way the attempt is a record, never a silent direct dial
    assert await ws_client(scene, "ws://blocked.test/chat") == {"status": 403}
    record = await scene.audit.wait_for(method="GET", host="blocked.test")
    assert (record["port"], record["reason"]) == (80, "block_rule")
    assert await ws_client(scene, "ws://ws.test/chat") == {"status": 400}
    record = await scene.audit.wait_for(method="GET", host="ws.test")
    assert (record["port"], record["reason"]) == (80, "bad_request")

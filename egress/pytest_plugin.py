"""pytest fixtures for testing a framework's integration with egress (docs/testing.md).

Registered through the `pytest11` entry point, so installing egress-netcut makes them
available to every test suite; nothing runs unless a test asks for a fixture.

- `egress_policy`, `egress_pins`: override these in a conftest to configure the proxy.
- `egress_proxy`: an `EgressProxy` on its own thread and event loop (usable from sync and
  async tests alike) that records every access record it makes (redacted, as callbacks get).
- `egress_upstream`: a pinned fake upstream — an HTTP server in its own network namespace
  on an address in 198.18.0.0/15, reachable by the proxy as `upstream.test` (root only).
- `egress_sandbox`: an empty network namespace (loopback up) to run a client in; the
  `egress_proxy` handle can open a listener inside it (root only).

Every namespace and link is named with the test process's pid and removed whatever the
outcome. Test traffic stays on this machine: addresses come from 198.18.0.0/15 only.

Requirements: pytest 8; the fixtures are synchronous, so `async def` tests that use them
need pytest-asyncio as well (`pip install 'egress-netcut[pytest]'`), as any async test does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import json
import os
import subprocess
import threading
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

import pytest

from .config import Settings, parse_resolve
from .policy.rules import Policy
from .proxy.net.listener import Listener
from .proxy.net.netns import listen_in_netns
from .proxy.server import EgressProxy
from .thread import ProxyThread

T = TypeVar("T")
UPSTREAM_NAME = "upstream.test"
_counter = itertools.count(1)


def _ip(*args: str, check: bool = True) -> None:
    subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def _need_root(what: str) -> None:
    if os.geteuid() != 0:
        pytest.fail(f"{what} needs root (it creates network namespaces)", pytrace=False)


@dataclass
class ProxyHandle:
    """What `egress_proxy` gives a test: the proxy, its URL and the records it made."""

    proxy: EgressProxy
    runner: ProxyThread
    records: list[dict[str, object]] = field(default_factory=list)
    _changed: threading.Condition = field(default_factory=threading.Condition)

    @property
    def url(self) -> str:
        return self.proxy.url

    def _record(self, event: dict[str, object]) -> None:  # runs on the proxy's thread
        with self._changed:
            self.records.append(event)
            self._changed.notify_all()

    def find(self, **want: object) -> list[dict[str, object]]:
        """Records whose fields equal `want` (e.g. `find(host="x.test", decision="block")`)."""
        with self._changed:
            return [r for r in self.records if all(r.get(k) == v for k, v in want.items())]

    def wait_for(self, timeout: float = 5.0, **want: object) -> dict[str, object]:
        """The first record with these fields, waiting up to `timeout` (TimeoutError)."""
        with self._changed:
            if not self._changed.wait_for(lambda: self._match(want), timeout):
                raise TimeoutError(f"no access record with {want} within {timeout} s")
            return self._match(want)[0]

    def _match(self, want: dict[str, object]) -> list[dict[str, object]]:
        return [r for r in self.records if all(r.get(k) == v for k, v in want.items())]

    def call(self, make: Callable[[], Coroutine[Any, Any, T]], timeout: float = 30.0) -> T:
        """Run a coroutine on the proxy's loop (e.g. `prepare_execution`) and return its
        result: the proxy's objects belong to that loop."""
        loop = self.runner._loop
        assert loop is not None
        future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(make(), loop)
        return future.result(timeout)

    def listen_in(self, namespace: str | Namespace, address: str = "127.0.0.1:3128") -> Listener:
        """Open a proxy listener inside `namespace` (its name, or the `egress_sandbox`
        fixture itself); a sandbox reaches it on its loopback."""
        name = namespace.name if isinstance(namespace, Namespace) else namespace
        return self.call(lambda: self.proxy.add_listener(address, netns=name))


@dataclass
class Namespace:
    """A network namespace made by a fixture; `exec` runs a command inside it."""

    name: str
    links: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        """The namespace's name: the fixture can stand where a name is formatted in."""
        return self.name

    def exec(self, *argv: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ip", "netns", "exec", self.name, *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def remove(self) -> None:
        for link in self.links:
            _ip("link", "del", link, check=False)
        _ip("netns", "del", self.name, check=False)


@dataclass
class Upstream:
    """The fake upstream: `name` resolves (pinned) to `addr`; `seen` lists request paths."""

    name: str
    addr: str
    port: int
    namespace: Namespace
    seen: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{self.name}/" if self.port == 80 else f"http://{self.name}:{self.port}/"

    @property
    def pin(self) -> str:
        return f"{self.name}={self.addr}"


def _new_namespace() -> Namespace:
    ns = Namespace(f"egp-{os.getpid()}-{next(_counter)}")
    try:
        _ip("netns", "add", ns.name)
        _ip("-n", ns.name, "link", "set", "lo", "up")
    except BaseException:
        ns.remove()
        raise
    return ns


def _addresses(index: int) -> tuple[str, str]:
    """A /30 in 198.18.0.0/17, offset from tests/harness.py's sequence (docs/testing.md)."""
    third, fourth = divmod(((index + 4096) % 8192) * 4, 256)
    return f"198.18.{third}.{fourth + 1}", f"198.18.{third}.{fourth + 2}"


def _upstream_namespace() -> tuple[Namespace, str]:
    ns = _new_namespace()
    n = next(_counter)
    tag = f"{os.getpid() % 100000}x{n}"
    root_side, ns_side = f"epr{tag}", f"epn{tag}"
    root_addr, ns_addr = _addresses(os.getpid() * 37 + n)
    ns.links.append(root_side)
    try:
        _ip("link", "add", root_side, "type", "veth", "peer", "name", ns_side)
        _ip("link", "set", ns_side, "netns", ns.name)
        _ip("addr", "add", f"{root_addr}/30", "dev", root_side)
        _ip("link", "set", root_side, "up")
        _ip("-n", ns.name, "addr", "add", f"{ns_addr}/30", "dev", ns_side)
        _ip("-n", ns.name, "link", "set", ns_side, "up")
        _ip("-n", ns.name, "route", "add", "default", "via", root_addr)
    except BaseException:
        ns.remove()
        raise
    return ns, ns_addr


def _serve_upstream(upstream: Upstream) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # answers every GET with a small JSON description
            upstream.seen.append(self.path)
            body = json.dumps({"server": "upstream", "path": self.path}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    sock = listen_in_netns(upstream.namespace.name, "0.0.0.0", upstream.port)
    sock.setblocking(True)
    server = ThreadingHTTPServer(("0.0.0.0", upstream.port), Handler, bind_and_activate=False)
    server.socket.close()
    server.socket = sock
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="egress-upstream", daemon=True).start()
    return server


@pytest.fixture
def egress_policy() -> Policy:
    """The policy of `egress_proxy`; override it (default: deny everything)."""
    return Policy()


@pytest.fixture
def egress_pins() -> dict[str, str]:
    """Name -> address pins for `egress_proxy` (`egress_upstream` adds its own)."""
    return {}


@pytest.fixture
def egress_upstream() -> Iterator[Upstream]:
    """An HTTP server on port 80 in its own namespace, pinned as `upstream.test`."""
    _need_root("egress_upstream")
    ns, addr = _upstream_namespace()
    upstream = Upstream(UPSTREAM_NAME, addr, 80, ns)
    server: ThreadingHTTPServer | None = None
    try:
        server = _serve_upstream(upstream)
        yield upstream
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
        ns.remove()


@pytest.fixture
def egress_sandbox() -> Iterator[Namespace]:
    """An empty network namespace (loopback up) to run a client in."""
    _need_root("egress_sandbox")
    ns = _new_namespace()
    try:
        yield ns
    finally:
        ns.remove()


@pytest.fixture
def egress_proxy(
    request: pytest.FixtureRequest, egress_policy: Policy, egress_pins: dict[str, str]
) -> Iterator[ProxyHandle]:
    """An in-process proxy on 127.0.0.1 with `egress_policy`, recording its access records.

    Pins `upstream.test` when the test also uses `egress_upstream`."""
    pins = dict(egress_pins)
    if "egress_upstream" in request.fixturenames:
        upstream: Upstream = request.getfixturevalue("egress_upstream")
        pins[upstream.name] = upstream.addr
    settings = Settings(egress_policy, resolve=parse_resolve([f"{k}={v}" for k, v in pins.items()]))
    holder: list[ProxyHandle] = []

    def record(event: dict[str, object]) -> None:
        holder[0]._record(event)

    runner = ProxyThread(lambda: EgressProxy(settings, on_decision=record))
    proxy = runner.start()
    handle = ProxyHandle(proxy, runner)
    holder.append(handle)
    try:
        yield handle
    finally:
        runner.stop()


__all__ = ["Namespace", "ProxyHandle", "Upstream"]

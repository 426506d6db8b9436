"""The execution boundary: the one call a framework makes right before its agent starts.

`prepare_execution` joins the proxy (`egress`) and the cut (`netcut`):

 1. The sandbox gets a proxy listener on its *own loopback* (a socket created inside its
    namespace, served by this process's event loop), bound to its client id and policy, and a
    forwarder on its loopback for each framework route. No host port is exposed to any
    container, and the cut keeps nothing but loopback. (`mode="gateway"` instead listens on
    the host address the sandbox reaches the host by, and the cut keeps those ports.)
    The cut runs in netcut's direct mode (`cut_mode="direct"`: netcut's worker enters the
    namespace) or through a helper container (`cut_mode="helper"`, docs/netcut.md#helper-mode)
    for a host process that cannot enter it; helper mode goes with `mode="gateway"`, since a
    loopback listener is itself a socket opened inside the namespace
    (docs/user-guide.md#helper-mode).
 2. The namespace is cut (`netcut.cut`) and probed: the proxy and forwarders must answer from
    inside, and every `expect_blocked` address must not. The namespace must then report `cut`.
 3. Only then is the agent's environment returned. **Fail closed**: any failure raises
    `ExecutionNotReady` and no environment is handed out.

A sandbox is one object with one lifecycle (docs/user-guide.md#sandbox-lifecycle): prepared
(listeners, forwarders, client added), prepared again (its policy replaced atomically, its
listeners reused, the cut idempotent), released (everything it added removed; a gateway
listener shared with another sandbox is reference-counted and stays while that one is cut).
One shared proxy serves many sandboxes, each with its own listener, policy and token.

With `transparent=True` the sandbox also gets a transparent listener and a DNS responder on
its loopback, and the cut redirects every other TCP connection and every DNS query to them
(docs/proxy.md#transparent-mode-and-socks5), so tools that ignore proxy settings are judged
too; `socks_port` adds a SOCKS5 listener beside the proxy listener.

The package follows those steps (docs/architecture.md): `execution.py` (what is handed out,
the errors), `checks.py` (the arguments), `sandboxes.py` (the per-proxy registry, listeners
and leases), `gateway.py` (where the host and the sandbox are), `cutting.py` (cut, probe,
status; direct or helper) and `lifecycle.py` (the three calls). The names below are the
ones importable from `egress.boundary`.
"""

from __future__ import annotations

from ..proxy.telemetry.observe import ExecutionSummary as ExecutionSummary
from .execution import CUT_MODES as CUT_MODES
from .execution import DNS_PORT as DNS_PORT
from .execution import PROXY_ENV as PROXY_ENV
from .execution import TRANSPARENT_PORT as TRANSPARENT_PORT
from .execution import CutMode as CutMode
from .execution import Execution as Execution
from .execution import ExecutionNotReady as ExecutionNotReady
from .execution import Mode as Mode
from .execution import ReleaseFailed as ReleaseFailed
from .execution import agent_env as agent_env
from .gateway import Network as Network
from .lifecycle import prepare_execution as prepare_execution
from .lifecycle import release_execution as release_execution
from .lifecycle import update_execution as update_execution
from .sandboxes import _REGISTRIES as _REGISTRIES

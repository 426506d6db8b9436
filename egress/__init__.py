"""egress: an in-process asyncio egress proxy with an audited allow/block policy.

Public API (everything else is internal)::

    from egress import EgressProxy, Policy, AuditLog
    async with AuditLog("audit.jsonl") as log, EgressProxy(policy, audit=log) as proxy: ...
"""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _package_version

from egress.proxy.net.netns import NamespaceError, listen_in_netns
from egress.proxy.telemetry.observe import ExecutionSummary

from .audit.log import AuditLog
from .boundary import (
    Execution,
    ExecutionNotReady,
    ReleaseFailed,
    prepare_execution,
    release_execution,
    update_execution,
)
from .boundary.plan import ExecutionPlan, client_id_from, plan_execution
from .config import ClientSpec, Settings, build_settings, load_policy_file
from .errors import EgressError, PolicyError, ProtocolError, TargetError
from .integrations.shared import close_shared_proxy, configure_shared_proxy, shared_proxy
from .policy.addrs import AddressGuard, classify
from .policy.compose import compose, from_harbor, from_verifiers
from .policy.judge import judge
from .policy.rules import Decision, Policy, Rule, parse_rule
from .policy.target import Target, make_target, normalize_host, parse_authority, parse_url
from .proxy.server import EgressProxy, Limits
from .thread import ProxyThread

try:  # the installed distribution's version (`egress --version`, docs/cli.md)
    __version__ = _package_version("egress-netcut")
except PackageNotFoundError:  # pragma: no cover - a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "AddressGuard",
    "AuditLog",
    "ClientSpec",
    "Decision",
    "EgressError",
    "EgressProxy",
    "Execution",
    "ExecutionNotReady",
    "ExecutionPlan",
    "ExecutionSummary",
    "Limits",
    "NamespaceError",
    "Policy",
    "PolicyError",
    "ProtocolError",
    "ProxyThread",
    "ReleaseFailed",
    "Rule",
    "Settings",
    "Target",
    "TargetError",
    "build_settings",
    "classify",
    "client_id_from",
    "close_shared_proxy",
    "compose",
    "configure_shared_proxy",
    "from_harbor",
    "from_verifiers",
    "judge",
    "listen_in_netns",
    "load_policy_file",
    "make_target",
    "normalize_host",
    "parse_authority",
    "parse_rule",
    "parse_url",
    "plan_execution",
    "prepare_execution",
    "release_execution",
    "shared_proxy",
    "update_execution",
]

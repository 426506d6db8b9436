"""Every public flag and argument is typed (issue 19 item 3, docs/policy.md#types).

One sweep over `egress.__all__` and `netcut.__all__`: every constructor and function that
takes a boolean, a number or a list gets `"false"`, `"0"`, `1`, `None` and `nan` in each such
parameter, and must raise a `TypeError` (a `ValueError` for nan in a number) naming the
parameter, before it opens, binds or cuts anything. Before the fix `Policy(report_only="false")`
switched enforcement off, and `AuditLog(keep_query="false")`, `EgressProxy(reuse_port="false")`
and `EgressProxy(require_auth="false")` were taken as true.

The sweep is driven by the signatures: a new public parameter whose annotation says bool,
int, float or a collection fails `test_every_typed_parameter_is_swept` until it is listed
here, so the sweep cannot silently fall behind the API.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import re
from collections.abc import Callable
from typing import Any

import pytest

import egress
import netcut
from egress import (
    AuditLog,
    EgressProxy,
    Execution,
    Limits,
    Policy,
    PolicyError,
)

BAD = ["false", "0", 1, None, math.nan]
NOWHERE = "netns:egress-sweep-does-not-exist"

# kinds: bool | number (finite float, 1 is fine) | count (int, 1 is fine) | port | list |
# mapping | instance (an object of a given class): every bad value is wrong for the last
# three. A "?" suffix: None is allowed.


def _proxy() -> EgressProxy:
    return EgressProxy(Policy())


def _execution() -> Execution:
    return Execution(
        sandbox=NOWHERE,
        client_id="sweep",
        proxy_url="http://127.0.0.1:1",
        env={},
        framework_urls={},
        token="t",
    )


# name -> (call(**override) -> result, {parameter: kind}); the result may be a coroutine
CASES: dict[str, tuple[Callable[..., Any], dict[str, str]]] = {
    "Policy": (
        lambda **kw: Policy(**kw),
        {
            "allow": "list",
            "block": "list",
            "framework_routes": "list",
            "report_only": "bool",
            "resolve_names_for_address_rules": "bool",
        },
    ),
    "AuditLog": (
        lambda **kw: AuditLog(None, **kw),
        {
            "keep_query": "bool",
            "rotate_bytes": "count?",
            "keep": "count?",
            "interim_interval": "number",
            "retry_interval": "number",
            "max_backlog": "count",
            "max_pending_bytes": "count",
            "events_maxlen": "count",
            "close_timeout": "number",
            "worker": "list?",
            "reserve_bytes": "count?",
        },
    ),
    "EgressProxy": (
        lambda **kw: EgressProxy(Policy(), **kw),
        {
            "listen": "list",
            "socks": "list",
            "require_auth": "bool",
            "metrics": "bool",
            "reuse_port": "bool",
            "admin_public": "bool",
            "tune_gc": "bool",
            "host_local": "list?",
            "on_decision": "callbacks?",
            "limits": "instance?",
            "audit": "instance?",
            "resolver": "instance?",
            "resolve": "mapping?",
        },
    ),
    "Limits": (
        lambda **kw: Limits(**kw),
        {
            "max_head": "count",
            "max_headers": "count",
            "head_timeout": "number",
            "connect_timeout": "number",
            "idle_timeout": "number",
            "max_connections": "count",
            "shutdown_grace": "number",
            "pool_idle": "number",
            "pool_per_key": "count",
            "max_client_connections": "count?",
            "max_unidentified": "count",
            "identify_timeout": "number",
            "max_client_inflight": "count?",
        },
    ),
    "AddressGuard": (
        lambda **kw: egress.AddressGuard(**kw),
        {"host_local": "list", "extra": "list", "reserve_private": "bool", "exempt": "list"},
    ),
    "ClientSpec": (
        lambda **kw: egress.ClientSpec(**{"client_id": "c", "policy": Policy(), **kw}),
        {"sources": "list", "policy": "instance"},
    ),
    "Settings": (
        lambda **kw: egress.Settings(**{"policy": Policy(), **kw}),
        {"clients": "list", "policy": "instance", "guard": "instance", "resolve": "mapping"},
    ),
    "build_settings": (
        lambda **kw: egress.build_settings(**kw),
        {
            "allow": "list",
            "block": "list",
            "framework_routes": "list",
            "resolve": "list",
            "reserve": "list",
            "reserve_private": "bool",
            "report_only": "bool",
        },
    ),
    "prepare_execution": (
        lambda **kw: egress.prepare_execution(
            **{"sandbox": NOWHERE, "policy": Policy(), "proxy": _proxy(), **kw}
        ),
        {
            "policy": "instance",
            "proxy": "instance",
            "framework_routes": "list",
            "proxy_port": "port",
            "expect_blocked": "list",
            "force": "bool",
            "allow_privileged": "bool",
            "transparent": "bool",
            "transparent_port": "port",
            "dns_port": "port",
            "socks_port": "port?",
        },
    ),
    "update_execution": (
        lambda **kw: egress.update_execution(
            **{"proxy": _proxy(), "execution": _execution(), "policy": Policy(), **kw}
        ),
        {"proxy": "instance", "execution": "instance", "policy": "instance"},
    ),
    "release_execution": (
        lambda **kw: egress.release_execution(
            **{"proxy": _proxy(), "execution": _execution(), **kw}
        ),
        {"proxy": "instance", "execution": "instance", "restore": "bool", "forget": "bool"},
    ),
    "plan_execution": (
        lambda **kw: egress.plan_execution(**{"client_id": "c", **kw}),
        {"framework_routes": "list", "proxy_port": "port"},
    ),
    "configure_shared_proxy": (
        lambda **kw: egress.configure_shared_proxy(**kw),
        {"resolve": "mapping?"},
    ),
    "compose": (
        lambda **kw: egress.compose(**{"evaluator": Policy(), "task": Policy(), **kw}),
        {"evaluator": "instance", "task": "instance"},
    ),
    "listen_in_netns": (
        lambda **kw: egress.listen_in_netns(
            **{"ns": "/nonexistent/egress-sweep", "host": "127.0.0.1", "port": 0, **kw}
        ),
        {"port": "port", "backlog": "count"},
    ),
    # the framework mappings take a mapping: the parameters are its keys
    "from_verifiers": (
        lambda **kw: egress.from_verifiers(
            {k: v for k, v in kw.items() if k != "any_connect_port"},
            **{k: v for k, v in kw.items() if k == "any_connect_port"},
        ),
        {"network_access": "bool", "allow": "list?", "block": "list?", "any_connect_port": "bool"},
    ),
    "from_harbor": (
        lambda **kw: egress.from_harbor({"network_mode": "allowlist", **kw}),
        {"allowed_hosts": "list"},
    ),
    # netcut
    "cut": (
        lambda **kw: netcut.cut(**{"target": NOWHERE, **kw}),
        {
            "keep": "list",
            "probe": "bool",
            "expect_blocked": "list",
            "force": "bool",
            "allow_privileged": "bool",
            "dry_run": "bool",
            "probe_timeout": "number",
        },
    ),
    "cut_async": (
        lambda **kw: netcut.cut_async(**{"target": NOWHERE, **kw}),
        {"keep": "list", "probe": "bool", "force": "bool", "dry_run": "bool"},
    ),
    "cut_and_status": (
        lambda **kw: netcut.cut_and_status(**{"target": NOWHERE, **kw}),
        {
            "keep": "list",
            "expect_reachable": "list",
            "expect_blocked": "list",
            "force": "bool",
            "allow_privileged": "bool",
            "probe_timeout": "number",
        },
    ),
    "cut_and_status_async": (
        lambda **kw: netcut.cut_and_status_async(**{"target": NOWHERE, **kw}),
        {"keep": "list", "force": "bool", "probe_timeout": "number"},
    ),
    "probe": (
        lambda **kw: netcut.probe(**{"target": NOWHERE, **kw}),
        {"expect_reachable": "list", "expect_blocked": "list", "timeout": "number"},
    ),
    "probe_async": (
        lambda **kw: netcut.probe_async(**{"target": NOWHERE, **kw}),
        {"expect_reachable": "list", "expect_blocked": "list", "timeout": "number"},
    ),
    "Keep": (
        lambda **kw: netcut.Keep(
            **{"addr": __import__("ipaddress").ip_address("198.18.0.1"), **kw}
        ),
        {"port": "port?"},
    ),
    "TargetRef": (
        lambda **kw: netcut.TargetRef(**{"kind": "netns", "value": "x", **kw}),
        {"bare": "bool"},
    ),
}

# public names that are results (returned, never taken from a caller) or take no flags
RESULTS = {
    "Decision",
    "Execution",
    "ExecutionPlan",
    "ExecutionSummary",
    "Rule",
    "Target",
    "CutPlan",
    "CutResult",
    "CutStatus",
    "ProbeItem",
    "ProbeResult",
    "RestoreResult",
    "ProxyThread",  # factory and audit: objects, checked on start
}
# pure functions the proxy calls per request, over values the typed constructors above made
# (Policy, AddressGuard, Target); a check there would be paid by every request
PER_REQUEST = {"judge", "classify", "make_target", "parse_url"}
# parameters whose annotation mentions int but take a string too (a PID is "1234" or 1234)
STRING_OR_INT = {
    ("pid", "value"),
    ("parse_target", "target"),
    ("prepare_execution", "sandbox"),
    ("forget", "target"),  # a target, or the (st_dev, st_ino) identity of a gone namespace
    ("choose_mode", "target"),
}

_TYPED = re.compile(r"\b(bool|int|float|Iterable|Sequence|tuple|list|frozenset)\b")


def _public() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for module in (egress, netcut):
        for name in module.__all__:
            obj = getattr(module, name)
            if isinstance(obj, type) and issubclass(obj, BaseException):
                continue
            if callable(obj):
                out[name] = obj
    return out


def test_every_typed_parameter_is_swept() -> None:
    """A public parameter typed bool/number/collection that the sweep does not know fails."""
    missing = []
    for name, obj in _public().items():
        if name in RESULTS or name in PER_REQUEST:
            continue
        for param in inspect.signature(obj).parameters.values():
            if param.kind is param.VAR_KEYWORD or (name, param.name) in STRING_OR_INT:
                continue
            if _TYPED.search(str(param.annotation)):
                listed = name in CASES and param.name in CASES[name][1]
                if not listed:
                    missing.append(f"{name}({param.name}: {param.annotation})")
    assert not missing, "add to CASES: " + ", ".join(missing)


def _bad_values(kind: str) -> list[object]:
    optional = kind.endswith("?")
    kind = kind.rstrip("?")
    values = list(BAD)
    if optional:
        values.remove(None)
    if kind in ("number", "count", "port"):
        values.remove(1)  # a real number
    if kind == "callbacks":
        values = ["false", "0", 1, math.nan]  # neither a callable nor a list of them
    return values


SWEEP = [
    pytest.param(name, param, value, id=f"{name}-{param}-{value!r}")
    for name, (_, params) in CASES.items()
    for param, kind in params.items()
    for value in _bad_values(kind)
]


def _run(result: object) -> None:
    if inspect.iscoroutine(result):
        asyncio.run(result)


@pytest.mark.parametrize(("name", "param", "value"), SWEEP)
def test_wrong_type_is_a_type_error_naming_the_parameter(
    name: str, param: str, value: object
) -> None:
    call, _ = CASES[name]
    nan = isinstance(value, float) and math.isnan(value)
    # nan is a float: out of range for a number (ValueError), a wrong type anywhere else
    expected: tuple[type[Exception], ...] = (TypeError, ValueError) if nan else (TypeError,)
    if name in ("from_verifiers", "from_harbor"):
        expected = (*expected, PolicyError)  # the mappings' documented error, naming the key
    with pytest.raises(expected) as caught:
        _run(call(**{param: value}))
    assert param in str(caught.value), f"{name}: the error does not name {param!r}: {caught.value}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_base_call_is_valid(name: str) -> None:
    """The sweep's base calls are valid, so each failure above is the swept value's doing."""
    call, _ = CASES[name]
    try:
        _run(call())
    except (OSError, netcut.NetcutError, egress.NamespaceError, egress.ExecutionNotReady, KeyError):
        pass  # got past the argument checks to the namespace, which does not exist

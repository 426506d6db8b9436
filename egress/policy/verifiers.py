"""verifiers 0.4's network policy (`NetworkPolicyConfig`, `TaskData.network_allow` /
`network_block`) as a `Policy` never wider than verifiers' own decision: by default that of
its proxy, `NetworkPolicy.permits(scheme, host, port, connect=True)`, or with
`any_connect_port=True` that of `NetworkPolicyConfig.permits` (docs/policy.md#verifiers).

Pure. verifiers' semantics, read from its `verifiers/v1/configs/runtime.py`:

- a rule is a host pattern, `host:port`, or a URL origin (`https://host[:port]`, the port
  defaulting to the scheme's; a path is ignored), parsed by `urllib.parse.urlsplit`; one that
  does not parse matches nothing;
- the host is an `fnmatch` glob on the destination name (`*` spans dots; `*.x` never matches
  `x` itself), the port any port unless given, the scheme any scheme unless given;
- an allow rule matches as written; a block rule also covers every subdomain of a bare
  domain; a destination is permitted when no block rule and some allow rule matches;
- `allow=[]`, or a `*` entry in `block`, is framework-only; `allow=["*"]` is everything on
  every port; concrete allow and block lists together are refused;
- a task's lists are applied by `with_task_network_policy`: the task's concrete allow list
  is intersected with the runtime's (provable glob containment only), blocks accumulate;
- `network_access=False` (`ModalConfig`) is framework-only, and refused together with any
  allow/block restriction, as `ModalConfig` refuses it. Its other checks (which rules Modal
  itself can enforce) are Modal's, not the policy's meaning, and are not repeated here.

- verifiers' proxy refuses a CONNECT to a port other than 443 unless an allow rule spelled
  `https://...` names that port (or `*` is allowed), and refuses loopback names.

Each rule is then written in our rule language, never wider than verifiers' decision, by
`transcribe.py` (`verifiers_policy`), which says how.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from fnmatch import fnmatchcase
from itertools import product
from typing import Any

from ..errors import PolicyError
from ..validate import as_bool, as_str_list
from .rules import Policy
from .transcribe import parse_verifiers_rule, verifiers_policy

_CONFIG_KEYS = {"allow", "block", "network_access"}
_TASK_KEYS = {"network_allow", "network_block"}
_MAGIC = re.compile(r"[*?[]")  # glob.has_magic


def from_verifiers(
    config: object, *, task: object | None = None, any_connect_port: bool = False
) -> Policy:
    """verifiers' network policy as a `Policy`; see the module docstring.

    `config` is a `NetworkPolicyConfig` (or any runtime config built on it, such as
    `DockerConfig`; a `ModalConfig` with `network_access=False` is framework-only, as
    verifiers' rollout makes it), its `model_dump()` dict (keys `allow`, `block`, and
    `network_access`), or a `TaskData` (or a dict of its `network_allow` / `network_block`),
    which is then applied to the default runtime config. `task` applies a task's lists to
    `config` as verifiers' `with_task_network_policy` does. By default a destination is
    decided as verifiers' own proxy decides it (`NetworkPolicy.permits`: CONNECT to a port
    other than 443 only under an `https://` rule naming it); `any_connect_port=True` decides
    as `NetworkPolicyConfig.permits` alone (every port of a rule without one), which is
    wider. Raises `PolicyError` for an unknown key, a wrong type, a config verifiers refuses,
    or a rule that cannot be written in our rule language without losing a block."""
    any_port = as_bool(any_connect_port, "from_verifiers any_connect_port")
    base: tuple[list[str], list[str]]
    task_lists = _task_lists(config)
    if task_lists is not None:
        if task is not None:
            raise PolicyError("verifiers: a TaskData is the task; pass the runtime config first")
        base, access, task_lists = (["*"], []), True, task_lists
    else:
        allow, block, access = _config_lists(config)
        base = _validated(allow, block)
        if task is not None:
            task_lists = _task_lists(task)
            if task_lists is None:
                raise PolicyError(f"verifiers: task must be a TaskData or its lists: {task!r}")
    allow, block = base
    if task_lists is not None:
        t_allow, t_block = task_lists
        # verifiers' utils/compile.py applies a task policy only when it says something
        if "*" not in t_allow or t_block:
            allow, block = _with_task(allow, block, t_allow, t_block)
    if not access:
        if "*" not in allow or block:
            raise PolicyError(
                "verifiers config: network_access=false cannot be combined with allow/block "
                "policies (ModalConfig: they require network_access=true for trusted setup)"
            )
        allow, block = [], ["*"]  # verifiers' rollout: NetworkPolicyConfig(allow=[])
    return verifiers_policy(allow, block, any_port)


# --- reading the inputs -----------------------------------------------------------------


def _config_lists(config: object) -> tuple[list[str], list[str], bool]:
    if isinstance(config, Mapping):
        unknown = sorted(str(k) for k in config if k not in _CONFIG_KEYS)
        if unknown:
            raise PolicyError(
                f"verifiers config: unknown key(s) {', '.join(map(repr, unknown))} "
                f"(known: {', '.join(sorted(_CONFIG_KEYS))})"
            )
        get = config.get
    elif hasattr(config, "allow") and hasattr(config, "block"):

        def get(key: str, default: object = None) -> object:
            return getattr(config, key, default)

    else:
        raise PolicyError(
            f"verifiers: expected a NetworkPolicyConfig, its model_dump() or a TaskData, "
            f"not {type(config).__name__}"
        )
    allow = _checked_list(get("allow", ["*"]), "verifiers config: allow")
    block = _checked_list(get("block", []), "verifiers config: block")
    try:
        access = as_bool(get("network_access", True), "verifiers config: network_access")
    except TypeError as exc:
        raise PolicyError(str(exc)) from None
    return allow, block, access


def _task_lists(value: object) -> tuple[list[str], list[str]] | None:
    """A TaskData's (or such a dict's) `network_allow` / `network_block`, else None."""
    if isinstance(value, Mapping):
        if not any(k in value for k in _TASK_KEYS):
            return None
        unknown = sorted(str(k) for k in value if k not in _TASK_KEYS)
        if unknown:
            raise PolicyError(
                f"verifiers task: unknown key(s) {', '.join(map(repr, unknown))} "
                "(known: network_allow, network_block)"
            )
        get: Any = value.get
    elif hasattr(value, "network_allow"):
        get = lambda key, default: getattr(value, key, default)  # noqa: E731
    else:
        return None
    allow = _checked_list(get("network_allow", ["*"]), "verifiers task: network_allow")
    block = _checked_list(get("network_block", []), "verifiers task: network_block")
    return allow, block


def _checked_list(value: object, field: str) -> list[str]:
    try:
        return list(as_str_list(value, field))
    except (TypeError, ValueError) as exc:
        raise PolicyError(str(exc)) from None


# --- verifiers' own rules, transcribed ---------------------------------------------------


def _validated(allow: list[str], block: list[str]) -> tuple[list[str], list[str]]:
    """`NetworkPolicyConfig.validate_network_policy`."""
    if not allow or "*" in block:
        return [], ["*"]
    if allow != ["*"] and block:
        raise PolicyError(
            "verifiers config: non-empty concrete allow and block egress lists are mutually "
            f"exclusive (allow={allow!r}, block={block!r})"
        )
    return allow, block


def _intersect_hosts(left: str, right: str) -> str:
    """`intersect_network_hosts`: the narrower pattern, "" when disjoint, ValueError when
    containment cannot be proven."""
    for parent, child in ((left, right), (right, left)):
        if parent in ("*", child):
            return child
        if _MAGIC.search(child) and not (parent.startswith("*.") and not _MAGIC.search(parent[2:])):
            continue
        if fnmatchcase(child, parent):
            return child
    if all(_MAGIC.search(h) for h in (left, right)) and any(
        _MAGIC.search(h.removeprefix("*.")) for h in (left, right)
    ):
        raise ValueError(f"cannot intersect network hosts {left!r} and {right!r}")
    return ""


def _with_task(
    base_allow: list[str], base_block: list[str], t_allow: list[str], t_block: list[str]
) -> tuple[list[str], list[str]]:
    """`NetworkPolicyConfig.with_task_network_policy`."""
    try:
        return _with_task_unchecked(base_allow, base_block, t_allow, t_block)
    except ValueError as exc:
        raise PolicyError(f"verifiers task policy: {exc}") from None


def _with_task_unchecked(
    base_allow: list[str], base_block: list[str], t_allow: list[str], t_block: list[str]
) -> tuple[list[str], list[str]]:
    allow, block = _validated(t_allow, t_block)
    if "*" in allow:
        allow = base_allow
    elif "*" not in base_allow:
        out: list[str] = []
        for left, right in product(allow, base_allow):
            if left == right:
                out.append(left)
                continue
            a, a_host, a_port = parse_verifiers_rule(left)
            b, b_host, b_port = parse_verifiers_rule(right)
            if any(not url.hostname or (url.path and not url.scheme) for url in (a, b)):
                raise ValueError(f"cannot intersect network rules {left!r} and {right!r}")
            if len({a.scheme, b.scheme} - {""}) > 1 or len({a_port, b_port} - {None}) > 1:
                continue
            host = _intersect_hosts(a_host, b_host)
            if not host:
                continue
            scheme = a.scheme or b.scheme
            port = a_port if a_port is not None else b_port
            authority = f"[{host}]" if ":" in host else host
            if port is not None:
                authority = f"{authority}:{port}"
            out.append(f"{scheme}://{authority}" if scheme else authority)
        allow = list(dict.fromkeys(out))
    block = list(dict.fromkeys([*block, *base_block]))
    return _validated(allow, block)


__all__ = ["from_verifiers", "parse_verifiers_rule"]

"""verifiers 0.4's network policy (`NetworkPolicyConfig`, `TaskData.network_allow` /
`network_block`) as a `Policy` that decides every destination as verifiers' own
`NetworkPolicyConfig.permits(scheme, host, port)` does (docs/policy.md#verifiers).

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

Each rule is rewritten in our rule language with the same meaning (`host:*` for any port,
`**.x` for verifiers' `*.x`, which never includes the apex, `*.x` for a block's bare `x`).
A rule that can match no destination our proxy accepts (one urlsplit rejects, port 0, a
scheme other than http/https, a character no host name has) is left out: it decides nothing
either way. What cannot be written exactly is a `PolicyError`, never an approximation.
Destinations are compared in their canonical spelling (`normalize_host`), the one our proxy
judges.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from fnmatch import fnmatchcase
from itertools import product
from typing import Any
from urllib.parse import SplitResult, urlsplit

from ..errors import PolicyError, TargetError
from ..validate import as_bool, as_str_list
from .rules import Policy
from .target import normalize_label

_CONFIG_KEYS = {"allow", "block", "network_access"}
_TASK_KEYS = {"network_allow", "network_block"}
_MAGIC = re.compile(r"[*?[]")  # glob.has_magic
_HOST_CHARS = re.compile(r"[a-z0-9_.*?-]+")  # what a canonical host name can match

VerifiersRule = tuple[str, str, int | None]  # (scheme or "", host pattern, port or None)


def from_verifiers(config: object, *, task: object | None = None) -> Policy:
    """verifiers' network policy as a `Policy`; see the module docstring.

    `config` is a `NetworkPolicyConfig` (or any runtime config built on it, such as
    `DockerConfig`; a `ModalConfig` with `network_access=False` is framework-only, as
    verifiers' rollout makes it), its `model_dump()` dict (keys `allow`, `block`, and
    `network_access`), or a `TaskData` (or a dict of its `network_allow` / `network_block`),
    which is then applied to the default runtime config. `task` applies a task's lists to
    `config` as verifiers' `with_task_network_policy` does. Raises `PolicyError` for an
    unknown key, a wrong type, a config verifiers refuses, or a rule that cannot be written
    exactly in our rule language."""
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
    return _policy(allow, block)


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


def parse_verifiers_rule(rule: str) -> tuple[SplitResult, str, int | None]:
    """`parse_network_rule`: (the parsed URL, the lower-cased host without trailing dots,
    the port or the scheme's default). Raises ValueError as urlsplit does."""
    parsed = urlsplit(rule if "://" in rule else f"//{rule}")
    port = parsed.port
    if parsed.scheme and port is None:
        port = 443 if parsed.scheme == "https" else 80
    return parsed, (parsed.hostname or "").lower().rstrip("."), port


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


# --- into our rule language --------------------------------------------------------------


def _policy(allow: list[str], block: list[str]) -> Policy:
    if not allow:
        return Policy(default="deny")  # framework-only: the framework routes alone
    ours_block = [r for rule in block for r in _translate(rule, "block")]
    ours_allow = [r for rule in allow for r in _translate(rule, "allow")]
    if "*:*" in ours_allow:
        return Policy(block=ours_block, default="allow")
    return Policy(allow=ours_allow, block=ours_block, default="deny")


def _translate(rule: str, action: str) -> list[str]:
    """Our rule text(s) for one verifiers rule: [] when it can match no destination."""
    try:
        parsed, pattern, port = parse_verifiers_rule(rule)
    except ValueError:
        return []  # network_rule_matches: a rule that does not parse matches nothing
    scheme = parsed.scheme
    if not pattern or scheme not in ("", "http", "https") or port == 0:
        return []
    ip = _ip(pattern)
    if ip is not None:
        mapped = isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None
        if str(ip) != pattern or mapped:
            raise _inexpressible(
                rule, f"write the address as {ip} (verifiers compares the text as written)"
            )
        hosts = [f"[{ip}]" if ip.version == 6 else str(ip)]
    else:
        host = _pattern(rule, pattern)
        if host is None or (host == "" and action == "allow"):
            return []
        hosts = [host]
        if action == "block" and not _MAGIC.search(pattern):
            # a bare block domain covers its subdomains (and itself, when it is a name)
            hosts = [f"**.{pattern}" if _numeric_tail(pattern) else f"*.{pattern}"]
    out = []
    for host in hosts:
        if scheme:
            out.append(f"{scheme}://{host}:{port}")
        else:
            out.append(f"{host}:{port if port is not None else '*'}")
    return out


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _numeric_tail(pattern: str) -> bool:
    return pattern.rsplit(".", 1)[-1].isdigit()


def _pattern(rule: str, pattern: str) -> str | None:
    """The host pattern in our syntax, None when it can match no canonical host (for a
    block, `_translate` adds the subdomains: `1.10.0.0` ends in `.10.0.0`)."""
    if not _HOST_CHARS.fullmatch(pattern) or ".." in pattern or pattern.startswith("."):
        return None  # a character (or an empty label) no canonical name has
    for label in pattern.split("."):
        if _MAGIC.search(label):
            continue
        try:
            same = normalize_label(label, rule) == label
        except (TargetError, PolicyError, ValueError):
            return None  # a label our proxy refuses in any destination
        if not same:
            raise _inexpressible(rule, f"label {label!r} is not in canonical form")
    if pattern.startswith("*.") and pattern != "*.":
        # verifiers' `*.x` never matches `x`; our leading `*.` does, `**.x` does not (and,
        # unlike `?*.x`, it also stands in a URL rule, where `?` would start a query)
        return "*" + pattern
    if _numeric_tail(pattern) and not _MAGIC.search(pattern):
        return ""  # numeric last label, not an address: no canonical host is exactly this
    return pattern


def _inexpressible(rule: str, why: str) -> PolicyError:
    return PolicyError(f"verifiers rule {rule!r} cannot be expressed exactly: {why}")

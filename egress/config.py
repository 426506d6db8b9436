"""Configuration: a policy file (TOML) and command-line options become one `Settings`.

Pure: parses text and data, touches no socket. The TOML format (documented in
docs/policy.md):

    default = "deny"                       # or "allow"
    allow = ["*.example.com", "https://api.example.org"]
    block = ["evil.example.com"]
    framework_routes = ["http://127.0.0.1:8080"]
    resolve = { "example.test" = "198.18.0.2" }   # or ["example.test=198.18.0.2"]
    reserve = ["198.51.100.0/24"]
    reserve_private = false

    [clients.sandbox-a]                    # per-client policy (token and/or source CIDRs)
    token = "s3cret"                       # or token_env = "SANDBOX_A_TOKEN"
    sources = ["198.18.7.0/24"]
    default = "deny"
    allow = ["pypi.org"]
    block = []

Command-line rules are added to the file's rules; `--default` overrides the file's posture.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from .errors import PolicyError, TargetError
from .policy.addrs import AddressGuard, parse_cidr
from .policy.rules import Policy, Posture
from .policy.target import IPAddress, IPNetwork, normalize_host, parse_ip_literal
from .validate import as_bool, as_instance, as_mapping, as_str, as_str_list, as_table

T = TypeVar("T")

_TOP_KEYS = {
    "default",
    "allow",
    "block",
    "framework_routes",
    "resolve",
    "reserve",
    "reserve_private",
    "mode",
    "resolve_names_for_address_rules",
    "clients",
}
_CLIENT_KEYS = {
    "token",
    "token_env",
    "sources",
    "default",
    "allow",
    "block",
    "framework_routes",
    "mode",
    "resolve_names_for_address_rules",
}

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


@dataclass(frozen=True, slots=True)
class ClientSpec:
    """A client identity (token and/or source networks) with its own policy."""

    client_id: str
    policy: Policy
    token: str | None = None
    sources: tuple[IPNetwork, ...] = ()

    def __post_init__(self) -> None:
        """Typed at construction (docs/policy.md#types): an empty token could never match."""
        as_str(self.client_id, "ClientSpec client_id")
        as_instance(self.policy, "ClientSpec policy", Policy, "a Policy")
        if self.token is not None:
            as_str(self.token, "ClientSpec token")
        if not isinstance(self.sources, tuple) or not all(
            isinstance(n, ipaddress.IPv4Network | ipaddress.IPv6Network) for n in self.sources
        ):
            raise TypeError(f"ClientSpec sources must be a tuple of networks, not {self.sources!r}")


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything that shapes decisions: policy, guard, pinned names, per-client policies."""

    policy: Policy
    guard: AddressGuard = field(default_factory=AddressGuard)
    resolve: Mapping[str, tuple[IPAddress, ...]] = field(default_factory=dict)
    clients: tuple[ClientSpec, ...] = ()

    def __post_init__(self) -> None:
        """Typed at construction (docs/policy.md#types)."""
        as_instance(self.policy, "Settings policy", Policy, "a Policy")
        as_instance(self.guard, "Settings guard", AddressGuard, "an AddressGuard")
        as_mapping(self.resolve, "Settings resolve")
        if not isinstance(self.clients, tuple) or not all(
            isinstance(c, ClientSpec) for c in self.clients
        ):
            raise TypeError(f"Settings clients must be a tuple of ClientSpec, not {self.clients!r}")


def parse_resolve(
    entries: Sequence[str], label: str = "--resolve"
) -> dict[str, tuple[IPAddress, ...]]:
    """`NAME=ADDR` pins (repeatable; several ADDRs for one NAME accumulate); errors name
    the entry as `label` (the option, or a policy file's `resolve` key)."""
    pins: dict[str, list[IPAddress]] = {}
    for entry in entries:
        name, sep, addr_text = entry.partition("=")
        if not sep or not name or not addr_text:
            raise PolicyError(f"{label} {entry!r}: expected NAME=ADDR (e.g. 'pypi.org=198.18.0.5')")
        try:
            host = normalize_host(name.strip())
        except TargetError as exc:
            raise PolicyError(f"{label} {entry!r}: {exc}") from None
        addr = parse_ip_literal(addr_text.strip())
        if addr is None:
            raise PolicyError(f"{label} {entry!r}: {addr_text!r} is not an IP address")
        pins.setdefault(host, []).append(addr)
    return {k: tuple(v) for k, v in pins.items()}


def resolve_pins(table: Mapping[str, str | Iterable[str]]) -> dict[str, tuple[IPAddress, ...]]:
    """`{NAME: ADDR}` or `{NAME: [ADDR, ...]}` as pins (`EgressProxy(resolve=...)`), checked
    as `parse_resolve` checks `NAME=ADDR`."""
    if not isinstance(table, Mapping):
        raise TypeError(f"resolve must be a mapping of name to address(es), not {table!r}")
    entries: list[str] = []
    for name, addrs in table.items():
        for addr in [addrs] if isinstance(addrs, str) else as_str_list(addrs, f"resolve {name}"):
            entries.append(f"{as_str(name, 'resolve name')}={addr}")
    return parse_resolve(entries)


def load_policy_file(path: str) -> dict[str, Any]:
    """Read a TOML policy file; `PolicyError` names the file and what is wrong."""
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise PolicyError(f"policy file {path!r}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"policy file {path!r}: invalid TOML ({exc})") from None
    except UnicodeDecodeError as exc:
        raise PolicyError(
            f"policy file {path!r}: not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from None
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise PolicyError(f"policy file {path!r}: unknown keys {sorted(unknown)}")
    return data


def _str_list(data: Mapping[str, Any], key: str, where: str) -> list[str]:
    return _checked(as_str_list, data.get(key, []), f"{where}: {key!r}")


def _checked(check: Callable[[object, str], T], value: object, field: str) -> T:
    """Run one of `validate`'s checks; a failure is a one-line `PolicyError` naming the
    field (the file's error type, reported by the CLI with exit code 2)."""
    try:
        return check(value, field)
    except (TypeError, ValueError) as exc:
        raise PolicyError(str(exc)) from None


def _posture(value: object, where: str) -> Posture:
    if value not in ("deny", "allow"):
        raise PolicyError(f"{where}: default must be 'deny' or 'allow', not {value!r}")
    return value


def _report_only(value: object, where: str) -> bool:
    """`mode = "enforce" | "report"` (docs/policy.md#report-only-mode)."""
    if value not in ("enforce", "report"):
        raise PolicyError(f"{where}: mode must be 'enforce' or 'report', not {value!r}")
    return value == "report"


def _by_address(data: Mapping[str, Any], default: bool, where: str) -> bool:
    """`resolve_names_for_address_rules = true`: allow address rules also judge the addresses
    a name resolves to, at the cost of a lookup per such name
    (docs/policy.md#no-lookup-decides-nothing)."""
    value = data.get("resolve_names_for_address_rules", default)
    return _checked(as_bool, value, f"{where}: 'resolve_names_for_address_rules'")


def build_settings(
    file_data: Mapping[str, Any] | None = None,
    *,
    allow: Sequence[str] = (),
    block: Sequence[str] = (),
    default: str | None = None,
    framework_routes: Sequence[str] = (),
    resolve: Sequence[str] = (),
    reserve: Sequence[str] = (),
    reserve_private: bool = False,
    report_only: bool = False,
    where: str = "policy",
) -> Settings:
    """Merge a policy file's data with command-line options into `Settings`.

    `report_only` (`--report-only`) puts the top-level policy and every client in report
    mode, whatever the file's `mode` keys say."""
    # the options are typed like the Python API's (docs/policy.md#types): a TypeError names one
    allow, block, framework_routes, resolve, reserve = (
        as_str_list(value, f"build_settings {name}")
        for name, value in (
            ("allow", allow),
            ("block", block),
            ("framework_routes", framework_routes),
            ("resolve", resolve),
            ("reserve", reserve),
        )
    )
    as_bool(reserve_private, "build_settings reserve_private")
    as_bool(report_only, "build_settings report_only")
    data = file_data or {}
    top_report = report_only or _report_only(data.get("mode", "enforce"), where)
    by_address = _by_address(data, False, where)
    posture = _posture(default if default is not None else data.get("default", "deny"), where)
    file_routes = _str_list(data, "framework_routes", where)
    file_allow, file_block = _str_list(data, "allow", where), _str_list(data, "block", where)
    if file_data is not None:  # the file's own entries first, so an error names the file
        try:
            Policy(allow=file_allow, block=file_block, framework_routes=file_routes)
        except PolicyError as exc:
            raise PolicyError(f"{where}: {exc}") from None
    routes = [*file_routes, *framework_routes]
    policy = Policy(
        allow=[*file_allow, *allow],
        block=[*file_block, *block],
        default=posture,
        framework_routes=routes,
        report_only=top_report,
        resolve_names_for_address_rules=by_address,
    )
    pins = parse_resolve(_resolve_entries(data.get("resolve", []), where), f"{where}: resolve")
    pins = _merge_pins(pins, parse_resolve(resolve))
    extra = tuple(
        _reserve(c, f"{where}: reserve") for c in _str_list(data, "reserve", where)
    ) + tuple(_reserve(c, "--reserve") for c in reserve)
    private = _checked(as_bool, data.get("reserve_private", False), f"{where}: 'reserve_private'")
    guard = AddressGuard(extra=extra, reserve_private=private or reserve_private)
    top_blocks = [*_str_list(data, "block", where), *block]
    table = _checked(as_table, data.get("clients", {}), f"{where}: 'clients'")
    clients = tuple(
        _client(
            cid,
            spec,
            routes,
            top_blocks,
            where,
            top_report=top_report,
            force_report=report_only,
            top_by_address=by_address,
        )
        for cid, spec in table.items()
    )
    return Settings(policy=policy, guard=guard, resolve=pins, clients=clients)


def _merge_pins(
    first: dict[str, tuple[IPAddress, ...]], then: dict[str, tuple[IPAddress, ...]]
) -> dict[str, tuple[IPAddress, ...]]:
    out = dict(first)
    for name, addrs in then.items():
        out[name] = (*out.get(name, ()), *addrs)
    return out


def _reserve(text: str, label: str) -> IPNetwork:
    """A reserved network; host bits are refused (`10.0.0.1/8` is a typo for `10.0.0.0/8`
    or `10.0.0.1/32`, and guessing which could reserve far less than meant)."""
    try:
        network = parse_cidr(text)
    except ValueError as exc:
        raise PolicyError(f"{label}: {exc}") from None
    given = text.strip().replace("[", "").replace("]", "")
    if "/" in given and str(network.network_address) != given.split("/", 1)[0]:
        raise PolicyError(
            f"{label}: {text!r} has host bits set: did you mean {str(network)!r} "
            f"(the network) or '{given.split('/', 1)[0]}' (one address)?"
        )
    return network


def _resolve_entries(value: object, where: str) -> list[str]:
    if isinstance(value, dict):
        return [f"{k}={v}" for k, v in value.items()]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return cast(list[str], value)
    raise PolicyError(f"{where}: 'resolve' must be a table or a list of 'NAME=ADDR'")


def toml_key(key: object) -> str:
    """`key` as a TOML table header spells it: bare when it may be, else quoted with its
    escapes (a newline in an error message would split the one line it must be)."""
    text = str(key)
    return text if _BARE_KEY.fullmatch(text) else json.dumps(text)


def _client(
    cid: str,
    spec: object,
    routes: list[str],
    top_blocks: list[str],
    where: str,
    *,
    top_report: bool = False,
    force_report: bool = False,
    top_by_address: bool = False,
) -> ClientSpec:
    """A per-client policy: its own allow rules and posture; the top-level block rules and
    framework routes apply to every client too (blocks compose, as in `compose`). Its `mode`
    and `resolve_names_for_address_rules` default to the top-level ones; `--report-only`
    forces report mode."""
    here = f"{where}: client {cid!r}"
    if not isinstance(spec, dict):
        raise PolicyError(f"{here}: must be a table ([clients.{toml_key(cid)}]), not {spec!r}")
    unknown = set(spec) - _CLIENT_KEYS
    if unknown:
        raise PolicyError(f"{here}: unknown keys {sorted(unknown)}")
    token: str | None = None
    if "token" in spec:
        # an empty token could never match a credential: refuse it rather than ignore it
        token = _checked(as_str, spec["token"], f"{here}: token")
    if "token_env" in spec:
        env = _checked(as_str, spec["token_env"], f"{here}: token_env")
        token = os.environ.get(env)
        if not token:
            raise PolicyError(f"{here}: environment variable {env!r} is empty")
    sources: list[IPNetwork] = []
    for text in _str_list(spec, "sources", here):
        try:
            sources.append(ipaddress.ip_network(text, strict=False))
        except ValueError as exc:
            raise PolicyError(f"{here}: source {text!r}: {exc}") from None
    if token is None and not sources:
        raise PolicyError(f"{here}: needs a token, token_env or sources")
    try:
        policy = Policy(
            allow=_str_list(spec, "allow", here),
            block=[*top_blocks, *_str_list(spec, "block", here)],
            default=_posture(spec.get("default", "deny"), here),
            framework_routes=[*routes, *_str_list(spec, "framework_routes", here)],
            report_only=force_report
            or _report_only(spec.get("mode", "report" if top_report else "enforce"), here),
            resolve_names_for_address_rules=_by_address(spec, top_by_address, here),
        )
    except PolicyError as exc:
        message = str(exc)
        raise PolicyError(message if message.startswith(here) else f"{here}: {message}") from None
    return ClientSpec(cid, policy, token, tuple(sources))


def settings_from_args(args: argparse.Namespace) -> Settings:
    """The settings that `egress serve`/`egress check` options and `--policy` describe
    (also what SIGHUP re-reads: docs/proxy.md)."""
    data = load_policy_file(args.policy) if args.policy else None
    return build_settings(
        data,
        allow=args.allow,
        block=args.block,
        default=args.default,
        framework_routes=args.framework_route,
        resolve=args.resolve,
        reserve=args.reserve,
        reserve_private=args.reserve_private,
        report_only=args.report_only,
        where=f"policy file {args.policy!r}" if args.policy else "policy",
    )

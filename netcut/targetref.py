"""What a caller can name as a target, parsed one way for `netcut` and `egress`. Pure.

Strategy (docs/netcut.md#targets). One parser, `parse_target`, used by netcut's API and CLI
and by egress (`listen_netns`, `prepare_execution`), so a value means the same thing to both:

- a `TargetRef`: itself;
- an `int`, `"pid:N"`, or `"N"` (ASCII digits): the network namespace of process N;
- a string starting with `/`: a namespace file (`/proc/N/ns/net`, `/run/netns/NAME`, a bind
  mount);
- `"netns:NAME"`: the named namespace `/run/netns/NAME`;
- `"container:ID"` (runtime detected), `"docker:ID"`, `"podman:ID"`, `"containerd:ID"` or
  `"containerd:NAMESPACE/ID"`: a container, by its task's PID as its runtime reports it;
- any other string: the named namespace `/run/netns/NAME`.

A bare digit string is a PID, like an int: PIDs arrive as text (`docker inspect` output,
argv), names that are numbers are rare. Its meaning never depends on what exists; but a
namespace *named* like that digit string is refused as ambiguous when the target is resolved
(resolve.py), so a name can never be cut as a PID by mistake or the other way round.

No I/O here: no os, socket or subprocess; resolution to a namespace file is resolve.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from netcut.errors import InvalidInput, InvalidType

NETNS_RUN_DIR = "/run/netns"
RUNTIMES = ("docker", "podman", "containerd")
# containerd keeps Kubernetes' containers in this namespace (the CRI plugin's).
CONTAINERD_NAMESPACE = "k8s.io"

Kind = Literal["netns", "path", "pid", "container"]


@dataclass(frozen=True)
class TargetRef:
    """What the caller named; target.resolve_target turns it into a namespace file.

    `runtime` (containers only) is docker, podman, containerd, or None to detect one;
    `namespace` is containerd's namespace (None: k8s.io). `bare` records that a PID came as
    a bare digit string, which resolution refuses when a namespace of that name exists."""

    kind: Kind
    value: str
    runtime: str | None = None
    namespace: str | None = None
    bare: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.bare, bool):
            raise InvalidType(f"TargetRef bare must be a boolean, not {self.bare!r}")

    def __str__(self) -> str:
        flag = {"netns": "--netns", "path": "--netns-path", "pid": "--pid"}.get(
            self.kind, "--container"
        )
        return f"{flag} {self.value}"

    @property
    def static_path(self) -> str | None:
        """The namespace file, when naming it needs no runtime (all but containers)."""
        if self.kind == "netns":
            return f"{NETNS_RUN_DIR}/{self.value}"
        if self.kind == "pid":
            return f"/proc/{self.value}/ns/net"
        if self.kind == "path":
            return self.value
        return None


def netns(name: str) -> TargetRef:
    if not name or "/" in name or name in (".", "..") or "\0" in name:
        raise InvalidInput(f"--netns {name!r}: a namespace name has no '/' (use --netns-path)")
    return TargetRef("netns", name)


def netns_path(path: str) -> TargetRef:
    if not path.startswith("/") or "\0" in path:
        raise InvalidInput(f"--netns-path {path!r}: give an absolute path")
    return TargetRef("path", path)


def pid(value: str | int) -> TargetRef:
    if isinstance(value, bool):
        raise InvalidInput(f"--pid {value!r}: not a process id")
    text = str(value).strip()
    if not text.isascii() or not text.isdigit() or int(text) <= 0:
        raise InvalidInput(f"--pid {text!r}: not a process id")
    return TargetRef("pid", str(int(text)))


def container(ident: str, runtime: str | None = None, namespace: str | None = None) -> TargetRef:
    if not ident or ident.startswith("-") or any(c.isspace() or c == "\0" for c in ident):
        raise InvalidInput(f"--container {ident!r}: not a container name or id")
    if runtime is not None and runtime not in RUNTIMES:
        raise InvalidInput(f"--runtime {runtime!r}: expected one of {', '.join(RUNTIMES)}")
    if namespace is not None and runtime not in (None, "containerd"):
        raise InvalidInput(f"--namespace {namespace!r}: applies to the containerd runtime only")
    if namespace is not None and (not namespace or "/" in namespace or namespace[0] == "-"):
        raise InvalidInput(f"--namespace {namespace!r}: not a containerd namespace")
    return TargetRef("container", ident, runtime, namespace)


_PREFIXES = ("pid", "netns", "container", *RUNTIMES)


def parse_target(target: TargetRef | str | int) -> TargetRef:
    """The one reading of a target value (the table in this module's docstring).

    Raises InvalidInput for a value that names nothing (an empty string, PID 0, a bool)."""
    if isinstance(target, TargetRef):
        return target
    if isinstance(target, bool) or not isinstance(target, int | str):
        raise InvalidInput(f"target {target!r}: give a namespace name, path, PID or container")
    if isinstance(target, int):
        return pid(target)
    if target.startswith("/"):
        return netns_path(target)
    if target.isascii() and target.isdigit():
        return TargetRef("pid", pid(target).value, bare=True)
    prefix, sep, rest = target.partition(":")
    if sep and prefix in _PREFIXES:
        return _prefixed(prefix, rest)
    return netns(target)


def _prefixed(prefix: str, rest: str) -> TargetRef:
    if prefix == "pid":
        return pid(rest)
    if prefix == "netns":
        return netns(rest)
    if prefix == "container":
        return container(rest)
    if prefix == "containerd" and "/" in rest:
        namespace, _, ident = rest.partition("/")
        return container(ident, "containerd", namespace)
    return container(rest, prefix)


def canonical(ref: TargetRef) -> str:
    """The one spelling of `ref` that `parse_target` reads back as `ref`: a name as itself
    (or `netns:NAME` where the bare name would read otherwise), `pid:N`, the path, or
    `RUNTIME:ID` / `containerd:NAMESPACE/ID` / `container:ID`. egress keys its sandboxes by
    it, so `1234`, `"1234"` and `"pid:1234"` are one sandbox."""
    if ref.kind == "pid":
        return f"pid:{ref.value}"
    if ref.kind == "path":
        return ref.value
    if ref.kind == "netns":
        plain = parse_target(ref.value) if ref.value[:1] != "/" else None
        return ref.value if plain == ref else f"netns:{ref.value}"
    if ref.runtime == "containerd" and ref.namespace is not None:
        return f"containerd:{ref.namespace}/{ref.value}"
    return f"{ref.runtime or 'container'}:{ref.value}"


def default_client_id(ref: TargetRef, inode: int | None = None) -> str:
    """A client id that tells sandboxes apart in the audit log: the namespace's name, `pid-N`,
    the container's runtime and id, or `netns-INODE` for any other namespace file (whose last
    path component, `net` for every /proc/N/ns/net, names nothing)."""
    if ref.kind == "netns":
        return ref.value
    if ref.kind == "pid":
        return f"pid-{ref.value}"
    if ref.kind == "container":
        return f"{ref.runtime or 'container'}-{ref.value[:12]}"
    parts = ref.value.rstrip("/").split("/")
    if len(parts) == 4 and parts[1] == "run" and parts[2] == "netns":
        return parts[3]
    if len(parts) == 5 and parts[1] == "proc" and parts[2].isdigit() and parts[3:] == ["ns", "net"]:
        return f"pid-{parts[2]}"
    if inode is not None:
        return f"netns-{inode}"
    return parts[-1] or "sandbox"

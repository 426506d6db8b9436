"""The default helper image, assembled from this host's own files: no registry, no package
manager, no network (docs/netcut.md#the-offline-helper-image).

The image holds bash (as /bin/sh, so the probe can use /dev/tcp), `ip` and `ss` (iproute2),
`xtables-legacy-multi` as iptables-legacy/ip6tables-legacy with the whole xtables extension
directory, `xtables-nft-multi` as iptables-nft-save (to read the nat rules an engine wrote with
iptables-nft: Docker's DNS redirection), `timeout` and `stat`, each under /netcut/bin, plus
every shared library `ldd` names for them, at the paths the host's loader uses; and a Python
interpreter with the few standard library files it starts with (`-I -S`), which opens the
sandbox's listeners and passes them back (helper/listeners.py,
docs/netcut.md#listeners-from-the-helper). It is imported with `RUNTIME import` from a tar
streamed on stdin. Its tag is `netcut-helper:<hash>`, where the hash covers the layout and the
path, size and mtime of every source file: a host upgrade of
iproute2 or iptables yields a new tag, the same host always finds its image again without
reading the files.
"""

from __future__ import annotations

import glob
import hashlib
import io
import os
import shutil
import subprocess
import tarfile
import time
from dataclasses import dataclass

from netcut.errors import TargetNotFound

# Bump when the layout changes: it is part of the tag.
LAYOUT_VERSION = "5"
BIN = "/netcut/bin"
# tool in the image -> names to look for on the host's PATH
_TOOLS = {
    "ip": ("ip",),
    "ss": ("ss",),
    "xtables-legacy-multi": ("xtables-legacy-multi",),
    # reads the nat rules an engine wrote with iptables-nft (Docker's DNS redirection)
    "xtables-nft-multi": ("xtables-nft-multi",),
    "timeout": ("timeout",),
    "stat": ("stat",),  # the namespace's identity as the helper sees it
    "bash": ("bash",),
}
_LINKS = {
    f"{BIN}/iptables-legacy": "xtables-legacy-multi",
    f"{BIN}/ip6tables-legacy": "xtables-legacy-multi",
    f"{BIN}/iptables-legacy-save": "xtables-legacy-multi",
    f"{BIN}/ip6tables-legacy-save": "xtables-legacy-multi",
    f"{BIN}/iptables-legacy-restore": "xtables-legacy-multi",
    f"{BIN}/ip6tables-legacy-restore": "xtables-legacy-multi",
    f"{BIN}/iptables-nft-save": "xtables-nft-multi",
    "/bin/sh": f"{BIN}/bash",
    "/bin/bash": f"{BIN}/bash",
}
PYTHON = f"{BIN}/python3"  # a link to the interpreter's own path (python_files)
_DIRS = ("/bin", "/etc", "/run", "/tmp", "/proc", "/sys", "/dev", BIN)
BUILD_TIMEOUT_S = 300.0
# Where distributions put libxtables' extensions (Debian: multiarch, package iptables).
_EXTENSION_DIRS = ("/usr/lib/*/xtables", "/usr/lib/xtables", "/lib/xtables", "/usr/lib64/xtables")


@dataclass(frozen=True)
class Sources:
    """The host files the image is made of: image path -> host path."""

    tools: dict[str, str]
    extensions: str  # the xtables extension directory, same path in the image
    # the interpreter and its start-up files, each at its host path (helper/listeners.py)
    python: tuple[str, ...] = ()

    def files(self) -> dict[str, str]:
        found = {f"{BIN}/{name}": path for name, path in self.tools.items()}
        found.update({path: path for path in self.python})
        for path in sorted(glob.glob(os.path.join(self.extensions, "*.so"))):
            found[path] = path
        return found


def find_sources() -> Sources:
    """Locate the tools and the extension directory; TargetNotFound names what is missing
    and the Debian package that ships it."""
    tools: dict[str, str] = {}
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin", "/usr/bin", "/bin"])
    for name, candidates in _TOOLS.items():
        found = next((p for c in candidates if (p := shutil.which(c, path=path))), None)
        if found is None:
            raise TargetNotFound(
                f"building the helper image needs {name} on this host"
                " (Debian packages: iproute2, iptables, coreutils, bash)"
            )
        tools[name] = os.path.realpath(found)
    dirs = [
        d
        for pattern in (
            "/usr/lib/*/xtables",
            "/usr/lib/xtables",
            "/lib/xtables",
            "/usr/lib64/xtables",
        )
        for d in sorted(glob.glob(pattern))
        if os.path.exists(os.path.join(d, "libxt_standard.so"))
    ]
    if not dirs:
        raise TargetNotFound(
            "building the helper image needs the xtables extension directory"
            " (libxt_standard.so; Debian package: iptables)"
        )
    return Sources(tools, dirs[0], python_files())


# The interpreter the helper runs its listener program with: the system's first (the same
# for every user of the host, so they share one image), else this process's own.
_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3")
# What `python -I -S` imports from files at start-up (the rest is built in or frozen), and
# the landmark it finds its prefix by.
_PY_STARTUP = ("encodings/__init__.py", "encodings/aliases.py", "encodings/utf_8.py", "os.py")


def python_files() -> tuple[str, ...]:
    """The interpreter (its real path), its start-up files and, when `_socket` is not built
    in, that one extension module: all the listener program needs (helper/listeners.py).
    Empty when no interpreter answers: the image then opens no listeners."""
    import sys

    candidates = [*_PYTHONS, sys.executable]
    for candidate in candidates:
        if not candidate or not os.access(candidate, os.X_OK):
            continue
        exe = os.path.realpath(candidate)
        found = _python_files_of(exe)
        if found:
            return found
    return ()


# python_files per interpreter, keyed by its path, size and mtime: asking it starts a process
# (~50 ms, several times that on a loaded host), and every helper operation names its image,
# twice (docs/benchmarks.md#the-boundary-through-the-helper). A replaced interpreter has a new
# key; the image tag hashes the files' own size and mtime in any case.
_PYTHON_FILES: dict[tuple[str, int, int], tuple[str, ...]] = {}


def _python_files_of(exe: str) -> tuple[str, ...]:
    """`python_files` of the interpreter `exe` (a real path); empty when it does not answer."""
    try:
        st = os.stat(exe)
    except OSError:
        return ()
    key = (exe, st.st_size, st.st_mtime_ns)
    if key not in _PYTHON_FILES:
        _PYTHON_FILES[key] = _ask_python(exe)
    return _PYTHON_FILES[key]


def _ask_python(exe: str) -> tuple[str, ...]:
    """Ask `exe` where its standard library and `_socket` are: the files, or ()."""
    probe = (
        "import sys, sysconfig, _socket; print(sysconfig.get_path('stdlib'));"
        " print(getattr(_socket, '__file__', ''))"
    )
    try:
        done = subprocess.run(
            [exe, "-I", "-c", probe], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return ()
    lines = done.stdout.splitlines()
    if done.returncode != 0 or len(lines) < 2:
        return ()
    stdlib, socket_so = lines[0], lines[1]
    files = [exe, *(os.path.join(stdlib, f) for f in _PY_STARTUP)]
    if socket_so:
        files.append(socket_so)
    return tuple(files) if all(os.path.isfile(f) for f in files) else ()


def image_tag(sources: Sources | None = None) -> str:
    """`netcut-helper:<hash>` of the layout and the source files' path, size and mtime."""
    sources = sources or find_sources()
    h = hashlib.sha256(LAYOUT_VERSION.encode())
    for inside, host in sorted(sources.files().items()):
        st = os.stat(host)
        h.update(f"{inside}\0{host}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return "netcut-helper:" + h.hexdigest()[:12]


def libraries(paths: list[str]) -> list[str]:
    """Shared libraries (and the loader) `ldd` names for `paths`, as absolute paths."""
    done = subprocess.run(["ldd", *paths], capture_output=True, text=True, timeout=60, check=False)
    found: set[str] = set()
    for line in done.stdout.splitlines():
        parts = line.split()
        if "=>" in parts:
            target = parts[parts.index("=>") + 1]
            if target.startswith("/"):
                found.add(target)
        elif parts and parts[0].startswith("/") and not parts[0].endswith(":"):
            found.add(parts[0])  # the loader: /lib64/ld-linux-x86-64.so.2 (0x...)
    return sorted(found)


def rootfs_tar(sources: Sources) -> bytes:
    """The image's root filesystem as an uncompressed tar (deterministic: mtime 0, root)."""
    files = sources.files()
    for lib in libraries(sorted(set(files.values()))):
        files.setdefault(lib, lib)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        made: set[str] = set()
        # the interpreter's second landmark (its exec prefix), a directory: helper/listeners.py
        dynload = [os.path.join(os.path.dirname(sources.python[-1]), "lib-dynload")]
        for d in (
            *_DIRS,
            *sorted({os.path.dirname(p) for p in files}),
            *dynload[: len(sources.python) > 0],
        ):
            _mkdirs(tar, d, made)
        for inside, host in sorted(files.items()):
            with open(host, "rb") as f:
                data = f.read()
            info = _info(inside, tarfile.REGTYPE, 0o755)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        links = dict(_LINKS)
        if sources.python:
            links[PYTHON] = sources.python[0]
        for inside, target in sorted(links.items()):
            info = _info(inside, tarfile.SYMTYPE, 0o777)
            info.linkname = target
            tar.addfile(info)
    return buf.getvalue()


def _info(path: str, kind: bytes, mode: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(path.lstrip("/"))
    info.type, info.mode, info.mtime = kind, mode, 0
    return info


def _mkdirs(tar: tarfile.TarFile, path: str, made: set[str]) -> None:
    parts = path.strip("/").split("/")
    for i in range(1, len(parts) + 1):
        sub = "/".join(parts[:i])
        if sub and sub not in made:
            made.add(sub)
            mode = 0o1777 if sub == "tmp" else 0o755
            tar.addfile(_info(sub, tarfile.DIRTYPE, mode))


@dataclass(frozen=True)
class Built:
    tag: str
    size_bytes: int  # of the rootfs tar
    seconds: float
    files: int


def build(runtime: str, tag: str | None = None, *, namespace: str | None = None) -> Built:
    """Assemble the rootfs and `RUNTIME import` it as `tag` (default: `image_tag()`); for
    containerd (`ctr`), as a one-layer OCI archive into containerd namespace `namespace`."""
    start = time.perf_counter()
    sources = find_sources()
    tag = tag or image_tag(sources)
    data = rootfs_tar(sources)
    if os.path.basename(runtime) == "ctr":
        argv = [runtime, "-n", namespace or "default", "images", "import", "-"]
        payload = oci_archive(data, tag)
    else:
        argv, payload = [runtime, "import", "-", tag], data
    try:
        done = subprocess.run(
            argv, input=payload, capture_output=True, timeout=BUILD_TIMEOUT_S, check=False
        )
    except FileNotFoundError:
        raise TargetNotFound(f"container runtime {runtime} not found") from None
    except subprocess.TimeoutExpired:
        raise TargetNotFound(f"{runtime} import: no answer in {BUILD_TIMEOUT_S:g}s") from None
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip() or f"exit {done.returncode}"
        raise TargetNotFound(f"importing helper image {tag} with {runtime}: {why}")
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        count = sum(1 for m in tar.getmembers() if m.isfile())
    return Built(tag, len(data), time.perf_counter() - start, count)


def oci_archive(rootfs: bytes, tag: str) -> bytes:
    """`rootfs` (a tar) as a one-layer OCI image archive named `tag`, for containerd's
    `ctr images import`, which takes image archives only (docker and podman import a bare
    rootfs tar). Deterministic: the same rootfs gives the same digests."""
    import json

    def blob(data: bytes) -> tuple[str, dict[str, object]]:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        return digest, {"digest": digest, "size": len(data)}

    layer_digest, layer = blob(rootfs)
    config = json.dumps(
        {
            "architecture": _oci_arch(),
            "os": "linux",
            "config": {"Entrypoint": ["/bin/sh"]},
            "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        },
        sort_keys=True,
    ).encode()
    config_digest, config_desc = blob(config)
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config_desc},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", **layer}],
        },
        sort_keys=True,
    ).encode()
    manifest_digest, manifest_desc = blob(manifest)
    name = tag if "/" in tag.split(":")[0] else f"docker.io/library/{tag}"
    index = json.dumps(
        {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    **manifest_desc,
                    "annotations": {
                        "io.containerd.image.name": name,
                        "org.opencontainers.image.ref.name": tag.rsplit(":", 1)[-1],
                    },
                }
            ],
        },
        sort_keys=True,
    ).encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for path, data in (
            ("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'),
            ("index.json", index),
            *(
                (f"blobs/sha256/{d.split(':')[1]}", b)
                for d, b in (
                    (layer_digest, rootfs),
                    (config_digest, config),
                    (manifest_digest, manifest),
                )
            ),
        ):
            info = _info(path, tarfile.REGTYPE, 0o644)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _oci_arch() -> str:
    machine = os.uname().machine
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)

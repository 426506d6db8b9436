"""Safety rails (docs/netcut.md#safety-rails): which namespaces must not be cut, and who
could undo a cut.

Reads /proc (and the caller's own capabilities by capget(2)). A process whose
/proc/PID/ns/net is the target namespace and that holds
CAP_NET_ADMIN (it could re-add routes), CAP_NET_RAW (raw frames bypass routes and netfilter)
or CAP_SYS_ADMIN (it could enter another namespace) is reported; cutting such a namespace
would be theatre. "Holds" means in its effective or permitted set (it can use it now), or in
its bounding set (a setuid-root or file-capability binary, `setcap cap_net_raw+ep`, gives it
back on execve) unless no_new_privs is set (then execve grants nothing: the bounding set is
moot). Ambient capabilities are a subset of the permitted set, so they are covered.
"""

from __future__ import annotations

import ctypes
import os
import threading

from netcut.errors import PrivilegeError, UnsafeTarget

CAP_NET_ADMIN = 12
CAP_NET_RAW = 13
CAP_SYS_ADMIN = 21
# include/linux/proc_ns.h: the nsfs inode of init_net, fixed since Linux 3.8.
PROC_NET_INIT_INO = 0xEFFFFFF9
DANGEROUS_CAPS = {
    CAP_NET_ADMIN: "CAP_NET_ADMIN",
    CAP_NET_RAW: "CAP_NET_RAW",
    CAP_SYS_ADMIN: "CAP_SYS_ADMIN",
}


def identity_of(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def is_initial_namespace(identity: tuple[int, int]) -> bool:
    """The host's initial namespace: PID 1's when readable (it is not always, e.g. under a
    supervisor that denies ptrace access), and in any case the kernel's init_net, whose nsfs
    inode is the constant PROC_NET_INIT_INO."""
    own = identity_of("/proc/self/ns/net")
    if own is not None and identity == (own[0], PROC_NET_INIT_INO):
        return True
    return identity == identity_of("/proc/1/ns/net")


def refuse_unsafe_namespace(identity: tuple[int, int]) -> None:
    """UnsafeTarget when `identity` is the caller's own or the host's initial namespace."""
    if identity == identity_of("/proc/self/ns/net"):
        raise UnsafeTarget("refusing to cut the caller's own network namespace (use --force)")
    if is_initial_namespace(identity):
        raise UnsafeTarget("refusing to cut the host's initial network namespace (use --force)")


# /proc/PID/status fields, in the order findings name them.
CAP_SETS = (("CapEff", "effective"), ("CapPrm", "permitted"), ("CapBnd", "bounding"))


def cap_names(cap_hex: str) -> list[str]:
    """The dangerous capabilities in a /proc status mask (hex); an unreadable mask counts as
    holding all of them (fail closed)."""
    try:
        mask = int(cap_hex, 16)
    except ValueError:
        mask = -1
    return [name for bit, name in sorted(DANGEROUS_CAPS.items()) if mask >> bit & 1]


def dangerous_caps(fields: dict[str, str]) -> list[str]:
    """'CAP_NET_RAW (bounding)'-style findings for one process's /proc status fields. Pure.

    A missing field counts as empty, except CapBnd, which every kernel since 2.6.26 shows."""
    nnp = fields.get("NoNewPrivs", "0").strip() == "1"
    held: dict[str, list[str]] = {}
    for field, label in CAP_SETS:
        if field == "CapBnd" and nnp:
            continue  # no_new_privs: execve cannot raise the permitted set from the bounding
        for name in cap_names(fields.get(field, "0")):
            held.setdefault(name, []).append(label)
    return [f"{name} ({', '.join(sets)})" for name, sets in held.items()]


def _status_fields(pid: str) -> dict[str, str]:
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return fields


class _SharedWalk:
    """Which processes are in which network namespace: one walk of /proc serves every caller
    that asked before it began.

    Why: the walk stats every process's ns/net (a few hundred on a host, ~1 ms), and a
    framework preparing 200 sandboxes at once asked for 200 walks that each saw the same
    thing (docs/netcut.md#many-sandboxes-at-once). A caller never gets a walk that began
    before it asked, so what it reads is as fresh as a walk of its own would have been."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.started = 0  # walks begun
        self.running = False
        self.done: tuple[int, dict[str, list[str]]] = (0, {})

    def ticket(self) -> int:
        """Taken when a caller asks: any walk begun after it is fresh enough for it."""
        with self.cond:
            return self.started

    def members(self, asked: int | None = None) -> dict[str, list[str]]:
        """The latest walk begun after ticket `asked` (now, when None), or a new walk."""
        with self.cond:
            if asked is None:
                asked = self.started
            while True:
                number, found = self.done
                if number > asked:
                    return found
                if not self.running:
                    break
                self.cond.wait()
            self.started += 1
            number = self.started
            self.running = True
        try:
            found = _walk()
        finally:
            with self.cond:
                self.running = False
                self.cond.notify_all()
        with self.cond:
            if number > self.done[0]:
                self.done = (number, found)
        return found


def _walk() -> dict[str, list[str]]:
    """Each process by the link its ns/net names (`net:[4026532001]`, the namespace's nsfs
    inode): a readlink is a quarter cheaper than a stat, and the link is the key as read."""
    members: dict[str, list[str]] = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                link = os.readlink(f"/proc/{pid}/ns/net")
            except OSError:
                continue  # exited meanwhile, or not ours to read
            members.setdefault(link, []).append(pid)
    return members


_walks = _SharedWalk()


def _fresh_walks_in_child() -> None:
    """A forked child must not wait on a walk of its parent's (its lock may be held)."""
    global _walks
    _walks = _SharedWalk()


os.register_at_fork(after_in_child=_fresh_walks_in_child)


def walk_ticket() -> int:
    """Take when the cut is asked for; pass to `refuse_privileged` when it is about to run:
    a walk any other cut began in between serves it too (docs/netcut.md#safety-rails)."""
    return _walks.ticket()


def privileged_processes(identity: tuple[int, int], ticket: int | None = None) -> tuple[str, ...]:
    """'pid 123 (comm): CAP_NET_RAW (effective, permitted, bounding), ...' for each process in
    the namespace holding one in any of those sets, by a walk of /proc begun after `ticket`
    was taken (now, when None)."""
    own = identity_of("/proc/self/ns/net")
    if own is None or own[0] != identity[0]:
        return ()  # not a namespace file (every nsfs inode has the same st_dev): no process
    found = []
    for pid in _walks.members(ticket).get(f"net:[{identity[1]}]", ()):
        try:
            fields = _status_fields(pid)
        except OSError:
            continue  # exited meanwhile
        names = dangerous_caps(fields)
        if names:
            found.append(f"pid {pid} ({fields.get('Name', '?')}): {', '.join(names)}")
    return tuple(found)


def refuse_privileged(identity: tuple[int, int], ticket: int | None = None) -> None:
    found = privileged_processes(identity, ticket)
    if found:
        raise UnsafeTarget(
            "refusing to cut: a process in the namespace could undo it"
            f" ({'; '.join(found)}); pass --allow-privileged to cut anyway",
            found,
        )


class _CapHeader(ctypes.Structure):
    _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))


class _CapData(ctypes.Structure):
    _fields_ = (
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    )


_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_libc = ctypes.CDLL(None, use_errno=True)


def own_effective_caps() -> int:
    """This thread's effective capability set, by capget(2): ~1 us, where reading
    /proc/self/status (the same mask) costs ~25 us in a process with many threads, once per
    cut and restore. /proc/self/status when the syscall fails."""
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if _libc.capget(ctypes.byref(header), data) != 0:
        return int(_status_fields("self").get("CapEff", "0"), 16)
    return int(data[0].effective) | int(data[1].effective) << 32


def require_privilege() -> None:
    """PrivilegeError unless this process can enter a namespace and change its network."""
    mask = own_effective_caps()
    missing = [
        name for bit, name in DANGEROUS_CAPS.items() if bit != CAP_NET_RAW and not mask >> bit & 1
    ]
    if missing:
        raise PrivilegeError(
            f"direct mode needs root or {' + '.join(missing)} (missing); for a docker or podman"
            " container, leave --mode out or give --mode helper: a helper container cuts"
            " without root (docs/netcut.md#modes-and-privileges)"
        )

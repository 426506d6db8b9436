"""The netfilter backend interface: how direct mode's executor puts the plan's backstop and
redirects into the kernel, reads them back, and takes them out (docs/netcut.md#backends).

Modelled on `flow.Executor`: a mode is an executor, and direct mode's executor holds one
backend. Every method runs inside the target namespace (netcut's worker, direct/worker.py) and acts
on that namespace alone. The plan never names a backend's terms (no tables, chains or
targets); `direct/iptables.py` is the one backend today, and an nftables backend is one new module
that implements this protocol.
"""

from __future__ import annotations

from typing import Protocol

from netcut.plan.model import OutputRule, RedirectRule, SeenBackstop


class Netfilter(Protocol):
    """A netfilter backend. Each install or remove is atomic per family, and every method
    leaves the namespace's other rules alone."""

    #: What its calls raise when the kernel refuses: the executor reports it as ApplyFailed.
    errors: tuple[type[Exception], ...]

    def install_backstop(self, family: int, rules: tuple[OutputRule, ...]) -> None:
        """Put (or refill) `rules` where every packet the namespace sends meets them first."""

    def remove_backstop(self, family: int) -> None:
        """Take the backstop out; nothing to do when it is absent."""

    def install_redirects(self, rules: tuple[RedirectRule, ...]) -> None:
        """Transparent mode (IPv4): `rules` ahead of routing's choice for every packet sent."""

    def remove_redirects(self) -> None:
        """Take the redirects out; nothing to do when they are absent."""

    def backstop_families(self) -> tuple[int, ...]:
        """The families that hold the backstop, read without creating anything."""

    def has_redirects(self) -> bool:
        """Does the namespace hold the redirects? Read without creating anything."""

    def read_backstop(self, family: int) -> SeenBackstop:
        """The backstop of `family` (one of `backstop_families()`) as it is, in the plan's
        terms, for `status` (docs/netcut.md#status)."""

    def prewarm(self) -> None:
        """Load what the backend needs once per worker, before its first namespace."""

"""The netfilter backend interface: how the plan's backstop and redirects get into the
kernel, are read back, and are taken out (docs/netcut.md#backends). Pure: protocols only.

Modelled on `flow.Executor`: a mode is an executor, and each executor holds a backend through
the face that fits it. `Netfilter` is direct mode's: its methods run inside the target
namespace (netcut's worker, direct/worker.py) and act on it. `ShellNetfilter` is helper
mode's: it writes the same changes as shell commands for the helper container and reads them
back from its state dump. The plan never names a backend's terms (no tables, chains or
targets).

A backend is one module: its `ShellNetfilter` is all both modes need. Helper mode runs its
commands in the helper container; direct mode runs the same commands in the namespace
(direct/shellface.py), unless the backend names a faster face of its own there (`native`).
`backend()` below is the one place netcut chooses it. The one backend today is iptables:
iptables_shell.py (its shell face, in iptables_text.py's rule language), and
direct/iptables.py, its native face over python-iptables; an nftables backend is one new
module with a `ShellNetfilter`.
"""

from __future__ import annotations

from typing import Protocol

from netcut.iptables_shell import IptablesShell, Section
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

    def read(self, verify: bool) -> tuple[tuple[int, ...], tuple[SeenBackstop, ...] | None, bool]:
        """What the namespace holds, read without creating anything, in one go (a state
        read asks once: the tables it opens serve every part): the families that hold the
        backstop; with `verify`, each one's backstop as it is, in the plan's terms, for
        `status` (docs/netcut.md#status), else None; and whether the redirects are there.
        As `ShellNetfilter.read_dump` answers for helper mode."""

    def prewarm(self) -> None:
        """Load what the backend needs once per worker, before its first namespace."""


class ShellNetfilter(Protocol):
    """A netfilter backend as helper mode drives it: shell commands for the helper
    container, and the state dump's netfilter sections read back."""

    #: Tools the helper's prelude finds for it: `ncut_NAME` runs the first binary found.
    tools: dict[str, str]
    #: Dump sections it always writes (a dump without one is refused).
    sections: tuple[str, ...]
    #: Its faster face in the namespace, as "module:Class" (a `Netfilter` that netcut's
    #: worker imports and makes), or None: direct mode runs these commands there instead.
    native: str | None

    def install_backstop(self, family: int, rules: tuple[OutputRule, ...]) -> list[str]:
        """Commands that put (or refill) the backstop, never leaving the namespace open."""

    def remove_backstop(self, family: int) -> list[str]:
        """Commands that take the backstop out; tolerant of what is already gone."""

    def batched_backstop(self, family: int, rules: tuple[OutputRule, ...] | None) -> str | None:
        """`install_backstop` (`remove_backstop` when `rules` is None) as one shell compound
        that makes the change in as few tool runs as the helper's image allows, falling back
        to those commands by itself; None when the backend has no such batch for `rules`."""

    def has_backstop(self, family: int) -> str:
        """A shell condition, true when `family`'s backstop is there (one tool run where
        the table is registered, none where it is not; it registers nothing): a restore's
        proof that its record is this namespace's (flow.UndoesIfCut)."""

    def install_redirects(self, rules: tuple[RedirectRule, ...]) -> list[str]: ...

    def remove_redirects(self) -> list[str]: ...

    def dump(self, section: Section, verify: bool) -> list[str]:
        """Shell for the dump's netfilter sections (with `verify`, the backstop's rules)."""

    def read_dump(
        self, sections: dict[str, str], verify: bool
    ) -> tuple[tuple[int, ...], tuple[SeenBackstop, ...] | None, bool]:
        """From the dump's sections: the families holding the backstop, each one's backstop
        as read back (None unless `verify`: a dump written with `verify`), and whether the
        redirects are there."""


def backend() -> ShellNetfilter:
    """The netfilter backend netcut uses, in both modes: the one place it is chosen
    (docs/netcut.md#backends)."""
    return IptablesShell()

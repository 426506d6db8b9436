"""Direct mode's face of a netfilter backend that brings none of its own: the backend's shell
commands (netfilter.py's `ShellNetfilter`, as helper mode runs them in the helper container)
run by /bin/sh in the namespace netcut's worker entered (direct/worker.py).

This is what makes a backend one module: its `ShellNetfilter` serves both modes. A backend
may name a faster face of its own (`native`, as iptables does with python-iptables); the
commands and the state read back are then the same rules either way, so either face, and
either mode, sees and undoes what the other wrote (docs/netcut.md#backends).

Strategy: each change is one script under `set -e` (the backend's commands never leave the
namespace open midway, as in helper mode); reading back is the backend's own dump sections,
read as helper mode reads them (helper/dump.py), every section's exit status checked. Bounded:
a script is a few dozen commands, and one that runs past `SCRIPT_TIMEOUT_S` fails the change.
"""

from __future__ import annotations

import importlib
import subprocess

from netcut.helper.dump import read_sections
from netcut.helper.script import prelude, section
from netcut.netfilter import Netfilter, ShellNetfilter
from netcut.plan.model import OutputRule, RedirectRule, SeenBackstop

# A backstop is a handful of commands (~10 ms each); 10 s means a tool is wedged.
SCRIPT_TIMEOUT_S = 10.0


class ShellFailed(Exception):
    """A backend's commands failed in the namespace (the executor reports ApplyFailed)."""


def in_namespace(shell: ShellNetfilter) -> Netfilter:
    """The backend's face in the namespace: its native one if it names one, else its
    commands run here."""
    if shell.native is None:
        return ShellInNamespace(shell)
    module, _, name = shell.native.partition(":")
    face: Netfilter = getattr(importlib.import_module(module), name)()
    return face


class ShellInNamespace:
    """`Netfilter` (netfilter.py) from a `ShellNetfilter` alone."""

    errors: tuple[type[Exception], ...] = (ShellFailed,)

    def __init__(self, shell: ShellNetfilter) -> None:
        self.shell = shell
        self._prelude = prelude(shell.tools)

    def install_backstop(self, family: int, rules: tuple[OutputRule, ...]) -> None:
        self._run(self.shell.install_backstop(family, rules))

    def remove_backstop(self, family: int) -> None:
        self._run(self.shell.remove_backstop(family))

    def install_redirects(self, rules: tuple[RedirectRule, ...]) -> None:
        self._run(self.shell.install_redirects(rules))

    def remove_redirects(self) -> None:
        self._run(self.shell.remove_redirects())

    def read(self, verify: bool) -> tuple[tuple[int, ...], tuple[SeenBackstop, ...] | None, bool]:
        families, seen, redirect = self._read(verify=verify)
        if not verify:
            return families, None, redirect
        found = {backstop.family: backstop for backstop in seen or ()}
        filters = tuple(found.get(f, SeenBackstop(f, None)) for f in families)
        return families, filters, redirect

    def prewarm(self) -> None:
        """Nothing to load: the tools start with each script."""

    def _read(
        self, *, verify: bool
    ) -> tuple[tuple[int, ...], tuple[SeenBackstop, ...] | None, bool]:
        text = self._run(self.shell.dump(section, verify), strict=False)
        return self.shell.read_dump(read_sections(text, self.shell.sections), verify)

    def _run(self, lines: list[str], *, strict: bool = True) -> str:
        script = self._prelude + ("set -e\n" if strict else "") + "\n".join(lines) + "\n"
        try:
            done = subprocess.run(
                ["/bin/sh", "-c", script],
                capture_output=True,
                text=True,
                timeout=SCRIPT_TIMEOUT_S,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ShellFailed(f"netfilter commands did not run: {exc}") from None
        if done.returncode != 0:
            said = (done.stdout + done.stderr).strip() or "no output"
            raise ShellFailed(f"netfilter commands failed (exit {done.returncode}): {said}")
        return done.stdout

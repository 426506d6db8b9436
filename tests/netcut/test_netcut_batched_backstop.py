"""Helper mode's batched backstop (one `-save` and one `-restore --noflush` per family,
iptables_shell.IptablesShell.batched_backstop) run by a real shell against real iptables in a
throwaway namespace: it must leave exactly what the per-command path leaves, repair included
(a stale jump and a leftover hold rule), and fall back to those commands in an image
without the restore tool."""

from __future__ import annotations

import pathlib
import subprocess
from collections.abc import Callable

import pytest
from netcut_testlib import sh

from netcut.helper.script import prelude, render_batched_script, render_script
from netcut.iptables_shell import IptablesShell
from netcut.plan.changes import AddBackstop, Op, RemoveBackstop
from netcut.plan.model import AF_INET, AF_INET6, OutputRule

pytestmark = pytest.mark.netns

RULES4 = (
    OutputRule("allow", out_iface="lo"),
    OutputRule("allow", "tcp", "198.18.0.1/32", 3128),
    OutputRule("reject"),
)
RULES6 = (OutputRule("allow", out_iface="lo"), OutputRule("reset", "tcp"), OutputRule("reject"))
CUT: tuple[Op, ...] = (AddBackstop(AF_INET, RULES4), AddBackstop(AF_INET6, RULES6))
UNCUT: tuple[Op, ...] = (RemoveBackstop(AF_INET), RemoveBackstop(AF_INET6))
HOLD = ["-m", "comment", "--comment", "netcut-hold", "-j", "REJECT"]


def _run(ns: str, script: str, *, restore: bool = True) -> subprocess.CompletedProcess[str]:
    head = prelude(IptablesShell().tools)
    if not restore:  # an image without the restore tools (found nowhere)
        head += "NCUT_IPTRESTORE=/missing/x; NCUT_IP6TRESTORE=/missing/x\n"
    return subprocess.run(
        ["ip", "netns", "exec", ns, "bash", "-c", f"{head}(\n{script}\n)"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _rules(ns: str) -> tuple[str, str]:
    return tuple(  # type: ignore[return-value]
        sh("ip", "netns", "exec", ns, tool, "-w", "-S").stdout
        for tool in ("iptables-legacy", "ip6tables-legacy")
    )


@pytest.mark.parametrize("restore", [True, False], ids=["batched", "fallback"])
def test_batched_cut_repair_and_removal_equal_the_commands(
    make_netns: Callable[[str], str], restore: bool
) -> None:
    batched, commands = make_netns("b"), make_netns("c")
    done = _run(commands, render_script(CUT))
    assert done.returncode == 0, done.stdout + done.stderr
    want = _rules(commands)
    assert "-A NETCUT -d 198.18.0.1/32 -p tcp -m tcp --dport 3128 -j ACCEPT" in want[0]

    assert "ncut_iptrestore -w --noflush" in render_batched_script(CUT)
    done = _run(batched, render_batched_script(CUT), restore=restore)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _rules(batched) == want

    # a repair: a stale second jump and a hold rule left by a run that died mid-way
    for tool in ("iptables-legacy", "ip6tables-legacy"):
        sh("ip", "netns", "exec", batched, tool, "-w", "-A", "OUTPUT", "-j", "NETCUT")
        sh("ip", "netns", "exec", batched, tool, "-w", "-A", "NETCUT", "-j", "ACCEPT")
        if restore:  # the per-command path leaves a stale hold rule as it is
            sh("ip", "netns", "exec", batched, tool, "-w", "-I", "OUTPUT", "1", *HOLD)
    done = _run(batched, render_batched_script(CUT), restore=restore)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _rules(batched) == want

    for ns in (batched, commands):
        done = _run(ns, render_batched_script(UNCUT, tolerant=True), restore=restore)
        assert done.returncode == 0, done.stdout + done.stderr
    assert _rules(batched) == _rules(commands)
    assert "NETCUT" not in "".join(_rules(batched))
    # removing what is gone is no error
    done = _run(batched, render_batched_script(UNCUT, tolerant=True), restore=restore)
    assert done.returncode == 0
    assert "NETCUT" not in "".join(_rules(batched))


def test_a_refused_batch_stops_the_strict_script(make_netns: Callable[[str], str]) -> None:
    """A restore the kernel refuses fails the cut (`set -e`), leaving nothing half made."""
    ns = make_netns("r")
    bad = (AddBackstop(AF_INET6, (OutputRule("allow", "tcp", "198.18.0.1/32", 53),)),)
    done = _run(ns, render_batched_script(bad) + "echo reached\n")
    assert done.returncode != 0
    assert "reached" not in done.stdout
    assert "NETCUT" not in _rules(ns)[1]


def _registered(ns: str, names: str) -> str:
    return sh("ip", "netns", "exec", ns, "cat", f"/proc/net/{names}").stdout


@pytest.mark.parametrize("save", [True, False], ids=["save", "no save"])
def test_the_backstop_check_tells_each_state_and_registers_nothing(
    make_netns: Callable[[str], str], save: bool
) -> None:
    """IptablesShell.has_backstop, the condition a helper restore undoes under: false in a
    namespace whose filter table no one registered (and it stays unregistered: listing it
    would register it), false with the table but no NETCUT chain, true with the backstop,
    per family; with `-save` or, in an image without it, `-S`."""
    ns = make_netns("k")
    shell = IptablesShell()

    def check() -> tuple[bool, bool]:
        head = "" if save else "NCUT_IPTSAVE=/missing/x; NCUT_IP6TSAVE=/missing/x\n"
        script = head + "".join(
            f"if {shell.has_backstop(f)}; then echo yes; else echo no; fi\n"
            for f in (AF_INET, AF_INET6)
        )
        done = _run(ns, script)
        assert done.returncode == 0, done.stdout + done.stderr
        answers = done.stdout.split()
        return answers[0] == "yes", answers[1] == "yes"

    before = (_registered(ns, "ip_tables_names"), _registered(ns, "ip6_tables_names"))
    assert "filter" not in "".join(before)
    assert check() == (False, False)
    assert (_registered(ns, "ip_tables_names"), _registered(ns, "ip6_tables_names")) == before

    sh("ip", "netns", "exec", ns, "iptables-legacy", "-w", "-N", "NETCUTX")  # a lookalike
    assert check() == (False, False)
    done = _run(ns, render_batched_script((AddBackstop(AF_INET6, RULES6),)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert check() == (False, True)
    done = _run(ns, render_batched_script((AddBackstop(AF_INET, RULES4),)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert check() == (True, True)
    done = _run(ns, render_batched_script(UNCUT, tolerant=True))
    assert done.returncode == 0, done.stdout + done.stderr
    assert check() == (False, False)


def test_a_removal_after_the_check_takes_the_table_the_check_saved(
    make_netns: Callable[[str], str], tmp_path: pathlib.Path
) -> None:
    """A helper restore's script (session.undo_if_cut): the check saves each family's
    filter table once and the removal reads that save, so a restore runs one `-save` per
    family, not two. Every save run is counted by wrapping the prelude's functions."""
    ns = make_netns("s")
    shell = IptablesShell()
    done = _run(ns, render_batched_script(CUT))
    assert done.returncode == 0, done.stdout + done.stderr
    runs = tmp_path / "saves"
    count = (
        f'ncut_iptsave() {{ echo 4 >> {runs}; "$NCUT_IPTSAVE" "$@"; }}\n'
        f'ncut_ip6tsave() {{ echo 6 >> {runs}; "$NCUT_IP6TSAVE" "$@"; }}\n'
    )
    script = (
        count
        + f"if {shell.has_backstop(AF_INET)}; then (\n"
        + render_batched_script(UNCUT, tolerant=True)
        + "\n); fi\n"
    )
    done = _run(ns, script)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "NETCUT" not in "".join(_rules(ns))
    # IPv4: the check's save only; IPv6 had no check, so its removal saved
    assert runs.read_text().split() == ["4", "6"]

"""The shell session netcut holds with the helper container (docs/netcut.md#helper-mode).

Shell. The container (`helper_argv`, the one run per operation, and its CLI transport) is
`helper/container.py`'s, re-exported here. `HelperExecutor` is `flow.Executor` over it: each
request (a script from `helper/script.py`) is written to the helper's /bin/sh and ends with a
marker carrying a random token and the exit status, so the host knows where an answer ends and
whether it failed; `close()` returns only once the container's process is gone. The default
image is imported the first time it is missing (helper/image.py). Which container to cut, and
the checks on it, are `helper/target.py`'s.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable
from dataclasses import replace
from types import TracebackType

from netcut.errors import ApplyFailed, InvalidInput
from netcut.helper import engineapi
from netcut.helper import image as helperimage
from netcut.helper.container import (
    CAPABILITIES,
    IMAGE_ENV,
    RUN_TIMEOUT_S,
    CliHelper,
    ctr_image,
    default_image,
    helper_argv,
    is_ctr,
    no_such_image,
    why_failed,
)
from netcut.helper.dump import (
    HelperFacts,
    parse_facts,
    parse_identity,
    parse_marks_dump,
    parse_state_dump,
)
from netcut.helper.script import (
    NETFILTER,
    PRELUDE,
    dns_probe_script,
    facts_script,
    identity_script,
    marks_script,
    parse_dns_probe,
    parse_probe,
    probe_script,
    render_batched,
    render_batched_script,
    state_script,
)
from netcut.plan import planner as plan_mod
from netcut.plan.changes import Op
from netcut.plan.model import Keep, NamespaceState, ProbeItem, ProbeResult


def _request(script: str, *, subshell: bool) -> tuple[bytes, bytes]:
    """`script` as the helper's shell runs it, followed by a marker line carrying a random
    token and the exit status; (the request, the marker that ends its answer)."""
    token = secrets.token_hex(8)
    body = f"(\n{script}\n) </dev/null" if subshell else f"{script}\ntrue"
    request = f'{body}; echo "### end {token} $?"\n'
    return request.encode(), f"### end {token} ".encode()


class HelperExecutor:
    """flow.Executor over one helper container per operation.

    `start()` launches it at once, before the target's `inspect` (both take a docker/podman
    client start and an engine round trip, so they overlap); nothing is sent to it until the
    target passed the checks, and a refused target's helper just sees its stdin close. With
    the Docker Engine API (engineapi.py) the inspect is one request and the helper starts at
    the first command, after it."""

    def __init__(self, runtime: str, container: str, image: str | None) -> None:
        self.runtime = runtime
        self.target = container  # name or id, as the caller gave it
        self.nameservers: tuple[str, ...] = ()
        # what the helper reported it sees (`read_facts`): why DNS cannot be verified
        self.dns_unverified: tuple[str, ...] = ()
        self.chosen = image or os.environ.get(IMAGE_ENV, "").strip() or None
        self.proc: CliHelper | engineapi.ApiHelper | None = None
        self.buffer = b""
        self.started = False  # the prelude answered
        self.runs = 0  # containers started (the goal is one per operation)
        self.requests = 0  # round trips to its shell (a restore's: three)
        self.netns: str | None = None  # containerd: the task's namespace file
        self.namespace: str | None = None  # containerd: its namespace
        self.binds: tuple[str, ...] = ()  # HOST:CONTAINER mounts (helper/listeners.py's)
        # the engine's API socket, when the helper runs without the CLI (engineapi.py)
        self.api = engineapi.find_socket(runtime)

    @property
    def transport(self) -> str:
        """How the helper runs: "api" (the Docker Engine API) or "cli"."""
        return "api" if self.api is not None else "cli"

    def __enter__(self) -> HelperExecutor:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close(wait=False)

    # -------------------------------------------------------------- the session

    def start(self) -> None:
        """Launch the helper container (returns at once; with the API, at the first send)."""
        if self.proc is None and self.api is None:
            self._spawn(self.chosen or default_image())

    def _ready(self, first: bytes, marker: bytes, timeout: float) -> tuple[int, str]:
        """Start the helper's shell and run the first request: the prelude and it are
        written at once (one round trip, not two); import the default image once when it is
        missing."""
        image = self.chosen or default_image()
        prelude, prelude_marker = _request(PRELUDE, subshell=False)
        for attempt in (1, 2):
            try:
                if self.proc is None:
                    self._spawn(image)
                self.started = True
                code, head = self._exchange(prelude + first, marker, timeout)
                said, _, rest = head.partition(prelude_marker.decode())
                status, _, out = rest.partition("\n")
                if status.strip() != "0":
                    raise ApplyFailed(f"helper shell failed (exit {status.strip()}): {said}")
                return code, out
            except ApplyFailed as exc:
                self.started = False
                missing = no_such_image(str(exc))
                if attempt == 2 or self.chosen is not None or not missing:
                    raise
                self.close()
                helperimage.build(self.runtime, image, namespace=self.namespace)
        raise AssertionError("unreachable")

    def _spawn(self, image: str) -> None:
        self.close()
        if self.api is not None:
            body = engineapi.create_body(self.target, image, CAPABILITIES, self.binds)
            self.proc = engineapi.ApiHelper(engineapi.Api(self.api), body)
        else:
            extra = tuple(arg for bind in self.binds for arg in ("-v", bind))
            argv = helper_argv(
                self.runtime,
                self.target,
                image,
                netns=self.netns,
                namespace=self.namespace,
                extra=extra,
            )
            self.proc = CliHelper(argv)
        self.runs += 1
        self.buffer = b""

    def send(
        self, script: str, timeout: float = RUN_TIMEOUT_S, *, subshell: bool = True
    ) -> tuple[int, str]:
        """Run `script` in a subshell of the helper's shell (in the shell itself for the
        prelude, whose functions must persist); (exit status, its output)."""
        request, marker = _request(script, subshell=subshell)
        self.requests += 1
        if not self.started:
            return self._ready(request, marker, timeout)
        return self._exchange(request, marker, timeout)

    def _exchange(self, request: bytes, marker: bytes, timeout: float) -> tuple[int, str]:
        """Write `request`; read up to its `marker`: (the exit status after it, the output
        before it)."""
        proc = self.proc
        assert proc is not None
        try:
            proc.write(request)
        except BrokenPipeError:
            raise ApplyFailed(f"helper container exited: {self._stderr()}") from None
        deadline = time.monotonic() + timeout
        while marker not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise ApplyFailed(f"helper container: no answer within {timeout:g}s")
            chunk = proc.read(left)
            if chunk == b"":
                raise ApplyFailed(f"helper container exited: {self._stderr()}")
            if chunk is not None:
                self.buffer += chunk
        head, _, rest = self.buffer.partition(marker)
        code_text, _, self.buffer = rest.partition(b"\n")
        code = int(code_text) if code_text.strip().isdigit() else 255
        return code, head.decode(errors="replace")

    def _stderr(self) -> str:
        proc = self.proc
        if proc is None:
            return "not running"
        said = proc.failure()
        self.close()
        return said

    def close(self, wait: bool = True) -> None:
        """End the session: close the shell's stdin. With `wait`, return once the
        container's process is gone, so no helper holding NET_ADMIN/NET_RAW is left in the
        namespace; without, what is left (the helper's exit, right after its stdin closed,
        and the engine's removal of its container) is a thread's (docs/netcut.md#helper-mode)."""
        proc, self.proc = self.proc, None
        self.started = False
        if proc is not None:
            proc.close(wait)

    # -------------------------------------------------------------- flow.Executor

    def read_facts(self) -> HelperFacts:
        """What the helper sees from inside: the namespace's identity, the container's
        resolvers and the engine's DNS redirection (helper/script.py's `facts_script`)."""
        return self._report(facts_script(), parse_facts)

    def read_identity(self) -> HelperFacts:
        """Only the namespace's identity (a restore's facts: it needs the record, which is
        keyed by it, and netcut's marks, not the resolvers)."""
        return self._report(identity_script(), parse_identity)

    def _report(self, script: str, parse: Callable[[str], HelperFacts]) -> HelperFacts:
        code, out = self.send(script)
        try:
            if code != 0:
                raise InvalidInput(f"exit {code}: {why_failed(out, code)}")
            return parse(out)
        except InvalidInput as exc:
            raise ApplyFailed(f"helper report failed: {exc}; nothing was changed") from None

    def undo_and_read_marks(self, ops: tuple[Op, ...]) -> tuple[list[str], NamespaceState | None]:
        """`undo`, then netcut's marks as they are left: one request, not two (the check
        after a restore: flow.restore). The marks are None when the undo failed."""
        token = secrets.token_hex(8)
        code, out = self.send(self._undo_then_marks(ops, token))
        return self._undone_marks(code, out, token)

    def undo_if_cut(
        self, ops: tuple[Op, ...], family: int
    ) -> tuple[list[str], NamespaceState | None, bool]:
        """`undo` if `family`'s backstop is there, then netcut's marks: one request
        (flow.UndoesIfCut). Without the backstop the marks are read as they were."""
        token = secrets.token_hex(8)
        unmarked = f"### unmarked {token}\n"
        script = (
            f"if {NETFILTER.has_backstop(family)}; then\n"
            f"{self._undo_then_marks(ops, token)}"
            f'else echo "{unmarked.strip()}"\n{state_script((), False)}fi\n'
        )
        code, out = self.send(script)
        if out.startswith(unmarked):
            return [], self._marks_dump(code, out[len(unmarked) :]), False
        errors, left = self._undone_marks(code, out, token)
        return errors, left, True

    def _undo_then_marks(self, ops: tuple[Op, ...], token: str) -> str:
        """`undo` in a subshell, its status after `### undone TOKEN`, then the marks."""
        return (
            f'(\n:\n{render_batched_script(ops, tolerant=True)}\n); echo "### undone {token} $?"\n'
            + marks_script()
        )

    def _undone_marks(
        self, code: int, out: str, token: str
    ) -> tuple[list[str], NamespaceState | None]:
        said, found, rest = out.partition(f"### undone {token} ")
        undo_code, _, dump = rest.partition("\n")
        if not found or undo_code.strip() != "0":
            why = f"exit {undo_code.strip() or code}"
            return [f"helper undo failed ({why}): {why_failed(said, code)}"], None
        if code != 0:
            raise ApplyFailed(f"helper state dump failed (exit {code}): {why_failed(dump, code)}")
        try:
            left = parse_marks_dump(dump)
        except InvalidInput as exc:
            raise ApplyFailed(f"{exc}; after the restore") from None
        # a marked route is left: its marks name its link, which only the whole state has
        return [], self.read_state((), ()).marks() if left is None else left

    def _marks_dump(self, code: int, dump: str) -> NamespaceState:
        """The marks of a whole state dump (read where the undo did not run)."""
        if code != 0:
            raise ApplyFailed(f"helper state dump failed (exit {code}): {why_failed(dump, code)}")
        try:
            return parse_state_dump(dump, self.nameservers).marks()
        except InvalidInput as exc:
            raise ApplyFailed(f"{exc}; nothing was changed") from None

    def read_state(
        self, keeps: tuple[Keep, ...], nameservers: tuple[str, ...], verify: bool = False
    ) -> NamespaceState:
        code, out = self.send(state_script(keeps, verify))
        if code != 0:
            raise ApplyFailed(f"helper state dump failed (exit {code}): {why_failed(out, code)}")
        try:
            state = parse_state_dump(out, nameservers or self.nameservers)
        except InvalidInput as exc:
            raise ApplyFailed(f"{exc}; nothing was changed") from None
        return replace(state, dns_unverified=self.dns_unverified) if self.dns_unverified else state

    def apply(self, ops: tuple[Op, ...]) -> None:
        lines = ["set -e"]
        for i, op in enumerate(ops):
            lines.append(f"echo '### op {i}'")
            lines += render_batched(op)
        code, out = self.send("\n".join(lines))
        if code == 0:
            return
        reached = [int(x[7:]) for x in out.splitlines() if x.startswith("### op ")]
        done = ops[: (reached[-1] + 1) if reached else 0]  # the failed op may be half done
        rollback = tuple(inv for op in reversed(done) if (inv := plan_mod.invert(op)) is not None)
        try:
            back, _ = self.send(render_batched_script(rollback, tolerant=True))
        except ApplyFailed:
            back = -1
        said = [x for x in out.splitlines() if not x.startswith("### op ")]
        why = why_failed("\n".join(said), code)
        failed = ops[reached[-1]] if reached else "the helper"
        note = "rolled back" if back == 0 else "rollback incomplete: run `netcut restore`"
        raise ApplyFailed(
            f"cut via helper failed at: {failed}: {why}; {note}", rolled_back=back == 0
        )

    def undo(self, ops: tuple[Op, ...]) -> list[str]:
        code, out = self.send(render_batched_script(ops, tolerant=True))
        return [] if code == 0 else [f"helper undo failed (exit {code}): {why_failed(out, code)}"]

    def probe(
        self,
        reachable: tuple[Keep, ...],
        blocked: tuple[Keep, ...],
        timeout: float,
        resolvers: tuple[str, ...] = (),
        name: str = "",
    ) -> ProbeResult:
        found = ProbeResult(())
        if reachable or blocked:
            code, out = self.send(probe_script(reachable, blocked, timeout), timeout + 30)
            if code != 0:
                raise ApplyFailed(f"helper probe failed (exit {code}): {why_failed(out, code)}")
            found = parse_probe(out, reachable, blocked)
        return ProbeResult((*found.items, *self.probe_dns(resolvers, name, timeout)))

    def probe_dns(
        self, resolvers: tuple[str, ...], name: str, timeout: float
    ) -> tuple[ProbeItem, ...]:
        """Ask each resolver for `name`; each must stay silent
        (docs/netcut.md#the-resolvers-from-inside)."""
        if not resolvers:
            return ()
        script = dns_probe_script(resolvers, name, timeout)
        code, out = self.send(script, timeout + 30)
        items = parse_dns_probe(out, resolvers)
        if code != 0 or any(item.outcome == "not probed" for item in items):
            raise ApplyFailed(f"helper DNS probe failed (exit {code}): {why_failed(out, code)}")
        return items


__all__ = [
    "CAPABILITIES",
    "IMAGE_ENV",
    "RUN_TIMEOUT_S",
    "CliHelper",
    "HelperExecutor",
    "ctr_image",
    "default_image",
    "helper_argv",
    "is_ctr",
    "no_such_image",
    "why_failed",
]

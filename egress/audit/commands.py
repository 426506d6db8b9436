"""What each `egress audit` subcommand does, from its parsed arguments to its exit code
(docs/audit-log.md#the-reviewers-commands); `cli.py` parses the arguments and calls these.

Strategy: every command streams the log line by line (gzip-rotated files are read
transparently, detected by their magic bytes, not their name), so memory is bounded by what
a command keeps: the summary by the number of distinct hosts, clients, reasons and rules
(client ports are dropped, or every connection would be its own client); tail by `-n`;
verify by `verify.HASH_WINDOW`. Files are read in the order given, except that a rotation
family (`PATH.3.gz PATH.2.gz PATH.1.gz PATH`) is put in chronological order, so a shell
glob `audit.jsonl*` just works. Exit codes: 0 ok, 1 verify failed, 2 usage or bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Final

from egress.audit.follow import Follower, GapFiller, rotated_history
from egress.audit.read import (
    ChainWatch,
    EventFilter,
    InputError,
    Line,
    Summary,
    chains,
    is_lifecycle,
    is_request,
    make_domain_of,
    order_paths,
    parse_record,
    read_lines,
)
from egress.audit.render import format_event, printable, render_summary
from egress.audit.timebounds import canonical_ts, parse_time_bound, utc_now
from egress.audit.verify import ChainVerifier, Problem, VerifyResult, worker_problems

DEFAULT_TOP: Final = 15  # rows per table in the terminal summary
DEFAULT_TAIL: Final = 10  # like tail(1)
DEFAULT_INTERVAL: Final = 0.25  # seconds between polls of a followed log
MAX_PROBLEMS_SHOWN: Final = 50  # verify prints this many, then a count
MAX_UNREADABLE_SHOWN: Final = 20  # unreadable lines named on stderr, then counted


def _warn(message: str) -> None:
    print(f"egress audit: warning: {message}", file=sys.stderr)


class Unreadable:
    """Lines that are not JSON objects (a truncated or damaged file, a foreign line): the
    reading commands skip them, name each on stderr as `FILE:LINE` (the first
    `MAX_UNREADABLE_SHOWN`), count them, and exit 1, so that a truncated log never reads
    as "nothing matched" (docs/audit-log.md#the-reviewers-commands).

    `located` passes lines on and remembers where the one being judged came from, so the
    commands can keep iterating bytes (the gap filler of `tail -f` passes them through)."""

    def __init__(self) -> None:
        self.count = 0
        self.damaged_files = 0  # compressed files that end early or are corrupt
        self.line = Line("?", 0, b"", True)  # the line being judged

    def damaged(self, path: str, why: str) -> None:
        """`read_lines`' report of a damaged `.gz`: its rest is unreadable too."""
        self.damaged_files += 1
        _warn(f"{path}: {why}")

    def located(self, lines: Iterable[Line]) -> Iterator[bytes]:
        for line in lines:
            self.line = line
            yield line.data

    def note(self) -> None:
        self.count += 1
        if self.count <= MAX_UNREADABLE_SHOWN:
            why = "not a JSON object" if self.line.complete else "truncated line (no newline)"
            _warn(f"{self.line.where}: {why}; skipped")

    def exit_code(self) -> int:
        """1 (and a closing line) when lines were skipped; 0 otherwise."""
        if not self.count:
            return 1 if self.damaged_files else 0
        more = self.count - MAX_UNREADABLE_SHOWN
        _warn(
            f"{self.count} line(s) were not JSON objects and were skipped"
            + (f" ({more} not named above)" if more > 0 else "")
            + "; run `egress audit verify`"
        )
        return 1


def _event_filter(args: argparse.Namespace) -> EventFilter:
    now = utc_now()
    try:
        since = canonical_ts(parse_time_bound(args.since, now)) if args.since else None
        until = canonical_ts(parse_time_bound(args.until, now)) if args.until else None
    except ValueError as exc:
        raise InputError(str(exc)) from None
    reasons = set(getattr(args, "reason", None) or ())
    for code in sorted(reasons):
        _known_reason(code)
    found = EventFilter(
        set(getattr(args, "decision", None) or ()),
        list(getattr(args, "host", None) or ()),
        list(getattr(args, "client", None) or ()),
        reasons,
        since,
        until,
    )
    found.modes = set(getattr(args, "mode", None) or ())
    return found


def _known_reason(code: str) -> None:
    """An unknown `--reason` would select nothing, silently: refuse it, naming the nearest
    codes (docs/audit-log.md#reason-codes)."""
    from difflib import get_close_matches

    from egress.reasons import Reason

    known = [r.value for r in Reason]
    if code in known:
        return
    near = get_close_matches(code, known, n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(near)}?" if near else "see docs/audit-log.md#reason-codes"
    raise InputError(f"--reason {code!r}: not a reason code; {hint}")


def cmd_summarize(args: argparse.Namespace) -> int:
    paths = order_paths(args.paths)
    window = _event_filter(args)
    summary = Summary()
    unreadable = Unreadable()
    watch = ChainWatch(paths)
    for data in unreadable.located(read_lines(paths, unreadable.damaged)):
        record = parse_record(data)
        watch.see(unreadable.line, record)
        if record is None:
            summary.bad_lines += 1
            unreadable.note()
        elif is_request(record):
            summary.ended(record)
            if window.in_window(record):
                summary.add(record)
        elif is_lifecycle(record):
            if window.in_window(record):
                summary.add_lifecycle(record)
        else:
            summary.track(record)
    summary.crashed()
    summary.derive_domains(make_domain_of())
    if args.json:
        out = {
            "files": paths,
            "since": window.since,
            "until": window.until,
            **summary.to_json(args.top),
        }
        print(json.dumps(out, indent=2))
    else:
        header = [printable(f"files: {' '.join(paths)}")]
        if window.since or window.until:
            header.append(f"window: {window.since or '-'} .. {window.until or '-'}")
        print(render_summary(summary, args.top or DEFAULT_TOP, header))
    return _finish(unreadable, watch)


def _finish(unreadable: Unreadable, watch: ChainWatch | None = None) -> int:
    """The closing warnings of a reading command, and its exit code (1: lines skipped)."""
    hint = watch.hint() if watch is not None else None
    if hint:
        _warn(hint)
    return unreadable.exit_code()


def _selected(
    args: argparse.Namespace, chooser: EventFilter, lines: Iterable[bytes], bad: Unreadable
) -> Iterator[tuple[bytes, dict[str, object]]]:
    for data in lines:
        record = parse_record(data)
        if record is None:
            bad.note()
            continue
        if is_request(record):
            if chooser.matches(record):
                yield data, record
        elif is_lifecycle(record):
            if chooser.matches_lifecycle(record):
                yield data, record
        elif args.control and chooser.in_window(record):
            yield data, record


def _emit(args: argparse.Namespace, data: bytes, record: dict[str, object]) -> None:
    text = data.decode("utf-8", "replace") if args.json else format_event(record)
    print(text, flush=args.follow if "follow" in args else False)


def cmd_filter(args: argparse.Namespace) -> int:
    chooser = _event_filter(args)
    unreadable = Unreadable()
    lines = unreadable.located(read_lines(order_paths(args.paths), unreadable.damaged))
    for data, record in _selected(args, chooser, lines, unreadable):
        _emit(args, data, record)
    return unreadable.exit_code()


def cmd_tail(args: argparse.Namespace) -> int:
    paths = order_paths(args.paths)
    chooser = _event_filter(args)
    history, live = (paths[:-1], paths[-1]) if args.follow else (paths, None)
    follower = Follower(live) if live is not None else None
    # `tail -f PATH` wants the whole log: lines rotated away before PATH was opened too
    gaps = GapFiller(live, _warn, from_start=not history) if live is not None else None
    last: deque[tuple[bytes, dict[str, object]]] = deque(maxlen=max(args.lines, 0))
    bad = Unreadable()
    try:
        older_lines: Iterator[Line] = read_lines(history, bad.damaged)
        if live is not None and not history:  # `tail -f PATH`: its rotated files come first
            older_lines = rotated_history(live)
        older = bad.located(older_lines)
        # through the gap filler too, so that following goes on from their last seq
        last.extend(_selected(args, chooser, gaps.feed(older) if gaps else older, bad))
        if follower is not None and gaps is not None:
            last.extend(_selected(args, chooser, gaps.feed(bad.located(_drain(follower))), bad))
        for data, record in last:
            _emit(args, data, record)
        while follower is not None and gaps is not None:
            fresh = gaps.feed(bad.located(_drain(follower)))
            for data, record in _selected(args, chooser, fresh, bad):
                _emit(args, data, record)
            time.sleep(args.interval)
    except KeyboardInterrupt:
        pass
    finally:
        if follower is not None:
            follower.close()
    return bad.exit_code()


def _drain(follower: Follower) -> Iterator[Line]:
    while True:
        lines = follower.read_lines()
        if not lines:
            return
        yield from lines


def cmd_verify(args: argparse.Namespace) -> int:
    paths = order_paths(args.paths)
    groups = chains(paths)
    results = [_verify_chain(group, args.live) for group in groups]
    result = results[0]
    if args.head and len(results) > 1:
        raise InputError("--head names one chain; give the files of one worker")
    if args.head and result.head != args.head.lower():
        result.problems.append(
            Problem(
                "end of input",
                f"head is {result.head}, expected {args.head} (lines missing or edited)",
            )
        )
    problems = [p for r in results for p in r.problems]
    # whole workers' files missing or renamed; `--head` verifies one worker on purpose
    problems += worker_problems(groups, results, complete=not args.head)
    for problem in problems[:MAX_PROBLEMS_SHOWN]:
        print(problem)
    if len(problems) > MAX_PROBLEMS_SHOWN:
        print(f"... and {len(problems) - MAX_PROBLEMS_SHOWN} more problems")
    for r in results:
        for note in r.continued:
            print(note)
        for tunnel in r.open_at_crash[:MAX_PROBLEMS_SHOWN]:
            print(tunnel)
        unlisted = r.open_at_crash_unlisted + max(0, len(r.open_at_crash) - MAX_PROBLEMS_SHOWN)
        if unlisted:
            print(f"... and {unlisted} more open at crash")
    if len(groups) > 1:  # one head per worker's chain
        for group, r in zip(groups, results, strict=True):
            print(f"chain {group[-1]}: {r.lines} lines, {r.runs} run(s), head {_head(r)}")
    verdict = "FAILED" if problems else "OK"
    shown = f", {len(problems)} problem(s)" if problems else ""
    lines, runs = sum(r.lines for r in results), sum(r.runs for r in results)
    requests = sum(r.requests for r in results)
    crashed = sum(len(r.open_at_crash) + r.open_at_crash_unlisted for r in results)
    shown += f", {crashed} open at crash" if crashed else ""
    head = _head(result) if len(results) == 1 else f"of {len(results)} chains above"
    print(
        f"{verdict}: {lines} lines in {len(paths)} file(s), {runs} run(s), "
        f"{requests} request records{shown}; head {head}"
    )
    return 1 if problems else 0


def _head(result: VerifyResult) -> str:
    return result.head or "(none: no lines)"


def _verify_chain(paths: list[str], live: bool) -> VerifyResult:
    verifier = ChainVerifier(live=live)
    for line in read_lines(paths, lambda p, why: verifier.problems.append(Problem(p, why))):
        verifier.feed(line.where, line.data, complete=line.complete)
    return verifier.finish()


def cmd_suggest(args: argparse.Namespace) -> int:
    """A minimal policy covering the logged traffic (docs/audit-log.md#egress-audit-suggest)."""
    from egress.audit.suggest import render, suggest
    from egress.policy.lint import lint_policy
    from egress.policy.rules import Policy

    paths = order_paths(args.paths)
    window = _event_filter(args)

    lifecycle = 0
    unreadable = Unreadable()

    def records() -> Iterator[dict[str, object]]:
        nonlocal lifecycle
        for data in unreadable.located(read_lines(paths, unreadable.damaged)):
            record = parse_record(data)
            if record is None:
                unreadable.note()
                continue
            if not window.in_window(record):
                continue
            if args.client and record.get("client_id") not in args.client:
                continue
            if is_lifecycle(record):
                lifecycle += 1
            elif is_request(record):
                yield record

    def lint(rules: list[str]) -> list[str]:
        return [str(f) for f in lint_policy(Policy(allow=rules))]

    result = suggest(records())
    result.lifecycle = lifecycle
    sys.stdout.write(render(result, make_domain_of(), lint, paths))
    return _finish(unreadable)


def cmd_report(args: argparse.Namespace) -> int:
    """One self-contained HTML page for a reviewer (docs/audit-log.md#egress-audit-report):
    the chain verified first, then one streaming pass; exit 1 when the chain is broken (the
    page is written all the same, and says so at the top)."""
    from egress.audit.report import ReportData, Verified, render_html

    paths = order_paths(args.paths)
    results = [_verify_chain(group, args.live) for group in chains(paths)]
    problems = [str(p) for r in results for p in r.problems]
    lines = sum(r.lines for r in results)
    requests = sum(r.requests for r in results)
    verdict = (
        f"{'FAILED' if problems else 'OK'}: {lines} lines in {len(paths)} file(s), "
        f"{sum(r.runs for r in results)} run(s), {requests} request records"
        + (f", {len(problems)} problem(s)" if problems else "")
        + (f"; head {_head(results[0])}" if len(results) == 1 else f"; {len(results)} chains")
    )
    data = ReportData()
    unreadable = Unreadable()
    for raw in unreadable.located(read_lines(paths, unreadable.damaged)):
        record = parse_record(raw)
        if record is None:
            data.summary.bad_lines += 1
            unreadable.note()
        else:
            data.add(record)
    data.summary.derive_domains(make_domain_of())
    shown = problems[:MAX_PROBLEMS_SHOWN]
    if len(problems) > len(shown):
        shown.append(f"... and {len(problems) - len(shown)} more problems")
    page = render_html(data, Verified(not problems, verdict, shown), paths, make_domain_of())
    temporary = f"{args.html}.tmp{os.getpid()}"
    try:
        # 0600 like the log it shows (docs/audit-log.md#egress-audit-report): it names every
        # host and client of the run
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)  # (a leftover temporary file keeps its mode otherwise)
        with open(fd, "w", encoding="utf-8") as out:
            out.write(page)
        os.replace(temporary, args.html)
    except OSError as exc:
        raise InputError(f"cannot write {args.html}: {exc.strerror or exc}") from None
    print(f"wrote {args.html} ({len(page.encode())} bytes); {verdict}")
    return max(1 if problems else 0, _finish(unreadable))


def cmd_export(args: argparse.Namespace) -> int:
    """The request records as OCSF events, one JSON line each; control and lifecycle records
    are left out, and counted on stderr (docs/audit-log.md#egress-audit-export)."""
    from egress import __version__
    from egress.audit.ocsf import to_ocsf

    window = _event_filter(args)
    paths = order_paths(args.paths)
    left_out = exported = 0
    unreadable, watch = Unreadable(), ChainWatch(paths)
    chain_of = {path: index for index, group in enumerate(chains(paths)) for path in group}
    runs: dict[int, str] = {}  # chain -> the run its lines belong to now
    for data in unreadable.located(read_lines(paths, unreadable.damaged)):
        record = parse_record(data)
        watch.see(unreadable.line, record)
        if record is None:
            unreadable.note()
        elif not is_request(record):
            left_out += 1
            if isinstance(record.get("run"), str):  # start, rotate, reopen, ... name the run
                runs[chain_of.get(unreadable.line.path, -1)] = str(record["run"])
        elif window.in_window(record):
            exported += 1
            run = runs.get(chain_of.get(unreadable.line.path, -1))
            event = to_ocsf(record, __version__, run=run, sequence=exported)
            print(json.dumps(event, separators=(",", ":")))
    if left_out:
        _warn(f"{left_out} control or lifecycle line(s) left out (not requests)")
    return _finish(unreadable, watch)

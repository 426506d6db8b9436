"""How many integration tests need root: counted from their markers, kept within a budget.

A test carries the `netns` marker only when what it proves needs root (the cut's boundary,
transparent mode's redirect, a listener inside a sandbox, an address of this host's own
interface); one that needs namespaces but not root runs in a user namespace of its own
(`userns`), and proxy behaviour runs against loopback upstreams
(docs/testing.md#which-tests-need-root). The count is pytest's own collection with `-m netns`,
the command a reviewer runs, not a hand-kept list, so a new root test counts the moment it is
written.
"""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# At most this many integration tests need root: 42 do as of this writing (down from 187; 36
# run in user namespaces instead). Headroom of a few lets a new sandbox test land without
# editing this file; lower it as tests move off root, never raise it without saying why.
BUDGET = 45


def root_tests() -> tuple[int, int]:
    """(tests marked `netns`, all tests) in tests/integration, as pytest collects them."""
    argv = [sys.executable, "-m", "pytest", "tests/integration", "-m", "netns"]
    argv += ["--collect-only", "-q", "-p", "no:cacheprovider"]
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    last = out.stdout.strip().splitlines()[-1]
    m = re.fullmatch(r"(\d+)/(\d+) tests collected \(\d+ deselected\) in [\d.]+s", last)
    assert m, f"unexpected collection summary {last!r}:\n{out.stdout[-2000:]}{out.stderr[-2000:]}"
    return int(m.group(1)), int(m.group(2))


def test_root_tests_within_budget() -> None:
    needs_root, total = root_tests()
    assert total > 100, total  # the collection really found the integration tests
    assert needs_root <= BUDGET, (
        f"{needs_root} of {total} integration tests need root (budget {BUDGET}): run what a "
        "test proves without a namespace where it can (docs/testing.md#which-tests-need-root)"
    )

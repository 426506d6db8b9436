"""The user guide's worked example runs as written (docs that drift are worse than none)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

import harness
from servers import run

pytestmark = pytest.mark.netns
GUIDE = Path(__file__).resolve().parents[2] / "docs" / "user-guide.md"


async def test_user_guide_worked_example(tmp_path: Path) -> None:
    text = GUIDE.read_text().split("## A worked example", 1)[1]
    code = re.search(r"```python\n(.*?)\n```", text, re.S)
    assert code is not None
    script = tmp_path / "boundary_example.py"
    script.write_text(code.group(1))
    ns = f"egt-{harness.os.getpid()}-docs"
    harness.ip("netns", "add", ns)
    try:
        harness.ip("-n", ns, "link", "set", "lo", "up")
        rc, out, err = await run(sys.executable, str(script), ns, timeout=60, cwd=str(tmp_path))
    finally:
        harness.ip("netns", "del", ns, check=False)
    assert rc == 0, out + err
    assert "403 block_rule" in out
    assert '{"path": "/v1/models"}' in out

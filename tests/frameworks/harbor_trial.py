"""Harbor's own CLI entry point (`harbor trials start ...`), run in this process after telling
egress's shared proxy where to audit and which names to pin (`EGRESS_AUDIT`,
`EGRESS_RESOLVE` as JSON). Runs in Harbor's venv; `test_harbor_trial.py` starts it."""

from __future__ import annotations

import json
import os
import sys

from egress import configure_shared_proxy

configure_shared_proxy(
    audit=os.environ["EGRESS_AUDIT"], resolve=json.loads(os.environ.get("EGRESS_RESOLVE", "{}"))
)

from harbor.cli.main import app  # noqa: E402  (after the proxy is configured)

sys.argv = ["harbor", *sys.argv[1:]]
app()

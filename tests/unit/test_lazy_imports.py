"""The proxy's start-up footprint: optional features import their libraries only when used.

aiohttp and prometheus_client back the admin listener (`--admin`); a proxy without it must not
load them (about 13 MB of idle RSS, docs/benchmarks.md). dnspython backs the DNS responder of
transparent mode; a proxy that opens no DNS listener must not load it either.
"""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
from egress import EgressProxy, Policy
proxy = EgressProxy(Policy())
assert proxy.admin_url is None
loaded = sorted({m.split('.')[0] for m in sys.modules} & {'aiohttp', 'prometheus_client', 'dns'})
print(','.join(loaded))
"""


def test_a_proxy_without_admin_or_dns_loads_no_aiohttp_prometheus_or_dnspython() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == ""

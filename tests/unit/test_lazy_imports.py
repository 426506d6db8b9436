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


NETCUT_CALLER = """
import sys
import netcut
netcut.cut, netcut.cut_and_status, netcut.restore, netcut.status  # the API egress calls
loaded = sorted({m.split('.')[0] for m in sys.modules} & {'iptc', 'pyroute2'})
print(','.join(loaded))
"""


def test_netcut_callers_load_no_python_iptables_or_pyroute2() -> None:
    """Only netcut's workers need python-iptables (whose import searches for its libraries
    with gcc and ldconfig: ~0.9 s and ~20 MB in the proxy before) and netlink: the API names
    the workers' jobs instead of importing them (netcut/direct/worker.py)."""
    out = subprocess.run(
        [sys.executable, "-c", NETCUT_CALLER],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert out.stdout.strip() == ""

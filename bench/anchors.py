"""The anchor bars: the peers' best figures measured earlier with the same method.

Copied from the project's BENCH-ANCHORS (best proxy median per run, then the most demanding
over 4 runs in `default` and `quiet` log modes). 'any' includes proxies that do not re-route
later requests on a kept-alive connection (pproxy, proxy.py); 'per-request' excludes them;
'python' is the best Python peer. They were measured on another machine of this kind, so
absolute figures are indicative: the same-run ratios of the bench are the fair comparison.
"""

from __future__ import annotations

# metric key (bench/report.py) -> (any peer, per-request peer, Python peer, direct)
BARS: dict[str, tuple[float, float, float, float | None]] = {
    "http_c1_rps": (10_376, 8_347, 10_376, 51_326),
    "http_c16_rps": (25_605, 11_958, 25_605, 67_126),
    "http_c64_rps": (23_098, 13_973, 23_098, 59_007),
    "http_c1_p50": (0.095, 0.113, 0.095, 0.018),
    "http_c1_p99": (0.198, 0.257, 0.198, 0.041),
    "http_c64_p50": (2.228, 4.016, 2.228, 1.040),
    "http_c64_p99": (4.019, 7.724, 4.019, 1.666),
    "tunnel_per_s": (8_327, 8_327, 2_942, 15_824),
    "tunnel_p99": (3.621, 3.621, 7.470, 2.771),
    "bulk_1": (1_811, 1_811, 1_089, 3_748),
    "bulk_8": (1_976, 1_976, 895.3, 3_236),
    "cpu_req_c64": (38.3, 70.1, 38.3, None),
    "cpu_tunnel": (105.4, 105.4, 334.4, None),
    "cpu_gb": (0.54, 0.54, 0.90, None),
    "idle_rss": (3.0, 3.0, 29.8, None),
    "peak_rss_c64": (4.6, 4.6, 30.7, None),
}

"""Same-run A/B of two source trees of this project: `egress serve` from each, alternated.

    .venv/bin/python -m bench.ab TREE_A TREE_B [--rounds 5] [--seconds 3]

TREE_A and TREE_B are checkouts (e.g. `git archive BASE | tar -x -C /tmp/base` and `.`).
Each tree's `egress serve` runs in the production shape the bench uses (the bench rule
set as a policy file, the audit log to a file, the origin's ports as framework routes),
pinned to the proxy core, with `PYTHONPATH` set to that tree; both stay up for the whole
run and take turns (the order flips every round) under: wrk -t1 -c64 and -c1 keep-alive
absolute-form GETs, and the C client's CONNECT tunnels at c16. CPU per request / tunnel is
the server's utime + stime from /proc over each run. Prints each round and the medians
(the machine is shared: read medians, bench/profile.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import rules as rulesmod
from bench.measure import Origin, Target, build_loadgen, forward_check, run_tunnels, run_wrk
from bench.metrics_cost import cpu_seconds
from bench.proxies import HOST, PROXY_CPU, pinned, wait_listening_line

SERVE = "import sys; from egress.cli import main; sys.exit(main())"


def start(
    tree: Path, name: str, origin: Origin, workdir: Path, extra: list[str] | None = None
) -> tuple[subprocess.Popen[bytes], int]:
    policy = workdir / f"{name}-policy.toml"
    policy.write_text(rulesmod.egress_toml(rulesmod.generate()))
    argv = [
        sys.executable,
        "-c",
        SERVE,
        "serve",
        "--quiet",
        "--listen",
        f"{HOST}:0",
        "--policy",
        str(policy),
        "--audit-log",
        str(workdir / f"{name}-audit.jsonl"),
    ]
    for p in [*origin.http_ports, origin.source_port]:
        argv += ["--framework-route", f"http://{HOST}:{p}"]
    argv += extra or []
    env = dict(os.environ, PYTHONPATH=str(tree.resolve()))
    log = workdir / f"{name}.out"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            pinned(argv, PROXY_CPU),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=workdir,
            env=env,
            start_new_session=True,
        )
    return proc, wait_listening_line(proc, log)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trees", nargs=2, type=Path)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=int, default=3)
    p.add_argument("--no-tunnels", action="store_true")
    p.add_argument(
        "--serve-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="an argument for both trees' `egress serve` (repeatable: "
        "--serve-arg=--audit-fail --serve-arg=closed)",
    )
    args = p.parse_args()
    names = ("A", "B")
    loadgen = build_loadgen()
    origin = Origin()
    procs: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
    res: dict[str, dict[str, list[float]]] = {n: {} for n in names}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            for name, tree in zip(names, args.trees, strict=True):
                procs[name] = start(tree, name, origin, work, args.serve_arg)
                check = forward_check(procs[name][1], origin)
                print(
                    json.dumps({"tree": name, "path": str(tree), "forward_check": check}),
                    flush=True,
                )
            for i in range(args.rounds):
                for name in names if i % 2 == 0 else names[::-1]:
                    proc, port = procs[name]
                    row = one_round(proc.pid, Target(port), origin, loadgen, args, work)
                    for k, v in row.items():
                        res[name].setdefault(k, []).append(v)
                    print(json.dumps({"round": i, "tree": name, **row}), flush=True)
    finally:
        for proc, _ in procs.values():
            proc.terminate()
            proc.wait(timeout=20)
        origin.close()
    summary = {n: {k: round(statistics.median(v), 2) for k, v in res[n].items()} for n in names}
    print(json.dumps({"medians": summary}))
    return 0


def one_round(
    pid: int, target: Target, origin: Origin, loadgen: Path, args: argparse.Namespace, work: Path
) -> dict[str, float]:
    row: dict[str, float] = {}
    for conc in (64, 1):
        cpu0 = cpu_seconds(pid)
        r = run_wrk(target, origin, conc, args.seconds, work)
        cpu = cpu_seconds(pid) - cpu0
        if not r["ratio_ok"] or r["socket_errors"] or r["status_errors"]:
            raise RuntimeError(f"bad wrk run: {r}")
        row[f"rps_c{conc}"] = round(r["rps"])
        row[f"cpu_us_per_req_c{conc}"] = round(cpu / max(1, r["requests"]) * 1e6, 2)
        row[f"p50_ms_c{conc}"] = round(r["p50_ms"], 3)
    if not args.no_tunnels:
        cpu0 = cpu_seconds(pid)
        t = run_tunnels(loadgen, target, origin, 16, float(args.seconds))
        cpu = cpu_seconds(pid) - cpu0
        row["tunnels_per_s_c16"] = round(t["tunnels"] / args.seconds)
        row["cpu_us_per_tunnel"] = round(cpu / max(1, t["tunnels"]) * 1e6, 2)
    return row


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""Versions of z9 side by side: W3 drain(C) of a base worktree A and of one or more worktrees B,
rounds interleaved (the order rotates every round), on one PostgreSQL, and the per-round ratios
B/A — the only comparison that holds on a shared, noisy machine.

Every side runs the same harness (this ``bench/`` folder's ``run.py -w W3 --rounds 1``, or
``--harness``) with its own virtualenv (``<worktree>/.venv``), so it drains with its own code and
its own migrations (every run.py creates a fresh database) and is measured the same way.

Usage::

    .venv/bin/python bench/ab.py --a /work/wt-base --b /work/wt-x --b . --rounds 5 --n 2000

Prints every drain line (JSON, with ``side``), then one ``ab_ratio`` line per B and concurrency:
median of the per-round ratios B/A of jobs/s and of CPU per job (executor process, and
PostgreSQL's backends for it: ``server_cpu_us_per_job``, which hardly depends on the machine's
other load), load1 of each round, round trips and commits per job.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from datetime import datetime, timezone
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


def run_side(worktree: str, harness: str, n: int, concurrency: str, dsn: str | None) -> list[dict[str, Any]]:
    py = os.path.join(worktree, ".venv", "bin", "python")
    cmd = [py, os.path.join(harness, "run.py"), "-w", "W3", "--rounds", "1", "--n", str(n), "--concurrency", concurrency]
    if dsn:
        cmd += ["--dsn", dsn]
    out = subprocess.run(cmd, cwd=worktree, capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise RuntimeError(f"{worktree}: run.py failed ({out.returncode})\n{out.stderr[-3000:]}")
    lines = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
    return [l for l in lines if l.get("workload") == "drain" and l.get("run") == 1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="worktree of the base version (with .venv)")
    ap.add_argument("--b", required=True, action="append", help="worktree measured against it (repeatable)")
    ap.add_argument("--harness", default=HERE, help="bench/ folder whose run.py every side runs")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--dsn", default=None, help="admin DSN passed to run.py (default: its own)")
    args = ap.parse_args()
    sides = {"a": os.path.abspath(args.a)}
    for i, b in enumerate(args.b, 1):
        sides[f"b{i}" if len(args.b) > 1 else "b"] = os.path.abspath(b)
    names = list(sides)
    got: dict[tuple[str, int, int], dict[str, Any]] = {}
    for rnd in range(1, args.rounds + 1):
        k = (rnd - 1) % len(names)
        order = names[k:] + names[:k]
        for side in order:
            for line in run_side(sides[side], args.harness, args.n, args.concurrency, args.dsn):
                line.update(side=side, worktree=sides[side], run=rnd)
                got[(side, rnd, line["concurrency"])] = line
                print(json.dumps(line), flush=True)
    for side in names[1:]:
        for c in [int(x) for x in args.concurrency.split(",")]:
            rounds = [r for r in range(1, args.rounds + 1) if ("a", r, c) in got and (side, r, c) in got]

            def ratio(key: str) -> tuple[float | None, list[float]]:
                xs = [got[(side, r, c)][key] / got[("a", r, c)][key] for r in rounds
                      if got[(side, r, c)].get(key) and got[("a", r, c)].get(key)]
                return (round(statistics.median(xs), 3) if xs else None), [round(x, 3) for x in xs]

            def med(s: str, key: str) -> float | None:
                vals = [got[(s, r, c)][key] for r in rounds if isinstance(got[(s, r, c)].get(key), (int, float))]
                return round(statistics.median(vals), 3) if vals else None

            jobs, jobs_all = ratio("jobs_per_s")
            print(json.dumps({
                "workload": "ab_ratio", "side": side, "concurrency": c, "n": args.n, "rounds": len(rounds),
                "ratio_jobs_per_s": jobs, "ratios": jobs_all,
                "ratio_executor_cpu_per_job": ratio("client_cpu_us_per_job")[0],
                "ratio_server_cpu_per_job": ratio("server_cpu_us_per_job")[0],
                "a_jobs_per_s": med("a", "jobs_per_s"), "b_jobs_per_s": med(side, "jobs_per_s"),
                "a_cpu_us_per_job": med("a", "client_cpu_us_per_job"), "b_cpu_us_per_job": med(side, "client_cpu_us_per_job"),
                "ratio_instructions_per_job": ratio("instructions_per_job")[0],
                "instructions_ratios": ratio("instructions_per_job")[1],
                "a_instructions_per_job": med("a", "instructions_per_job"),
                "b_instructions_per_job": med(side, "instructions_per_job"),
                "ratio_steady_cpu_per_job": ratio("client_steady_cpu_us_per_job")[0],
                "steady_ratios": ratio("client_steady_cpu_us_per_job")[1],
                "a_steady_cpu_us_per_job": med("a", "client_steady_cpu_us_per_job"),
                "b_steady_cpu_us_per_job": med(side, "client_steady_cpu_us_per_job"),
                "a_user_us_per_job": med("a", "client_user_us_per_job"), "b_user_us_per_job": med(side, "client_user_us_per_job"),
                "a_sys_us_per_job": med("a", "client_sys_us_per_job"), "b_sys_us_per_job": med(side, "client_sys_us_per_job"),
                "a_server_cpu_us_per_job": med("a", "server_cpu_us_per_job"),
                "b_server_cpu_us_per_job": med(side, "server_cpu_us_per_job"),
                "a_round_trips_per_job": med("a", "round_trips_per_job"), "b_round_trips_per_job": med(side, "round_trips_per_job"),
                "a_commits_per_job": med("a", "commits_per_job"), "b_commits_per_job": med(side, "commits_per_job"),
                "load1": [max(got[(s, r, c)]["load1"] for s in ("a", side)) for r in rounds],
                "a": sides["a"], "b": sides[side],
                "at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            }), flush=True)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Two versions of z9 side by side: W3 drain(C) of worktree A and of worktree B, rounds interleaved
(A then B in odd rounds, B then A in even ones), on one PostgreSQL, and the per-round ratio B/A —
the only comparison that holds on a shared, noisy machine.

Each side runs its own ``bench/run.py -w W3 --rounds 1`` with its own virtualenv (``<worktree>/.venv``),
so each drains with its own code and its own migrations (every run.py creates a fresh database).

Usage::

    .venv/bin/python bench/ab.py --a /work/wt-base --b . --rounds 5 --n 2000 --concurrency 1,4,16

Prints every drain line it got (JSON, with ``side``), then one ``ab_ratio`` line per concurrency:
median of the per-round ratios B/A of jobs/s, the ratios themselves, load1 of each round, and the
medians of both sides' round trips, commits and executor CPU per job.
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


def run_side(worktree: str, n: int, concurrency: str, dsn: str | None) -> list[dict[str, Any]]:
    py = os.path.join(worktree, ".venv", "bin", "python")
    cmd = [py, os.path.join(worktree, "bench", "run.py"), "-w", "W3", "--rounds", "1", "--n", str(n),
           "--concurrency", concurrency]
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
    ap.add_argument("--b", required=True, help="worktree of the version measured against it")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--dsn", default=None, help="admin DSN passed to run.py (default: its own)")
    args = ap.parse_args()
    sides = {"a": os.path.abspath(args.a), "b": os.path.abspath(args.b)}
    got: dict[tuple[str, int, int], dict[str, Any]] = {}
    for rnd in range(1, args.rounds + 1):
        order = ["a", "b"] if rnd % 2 else ["b", "a"]
        for side in order:
            for line in run_side(sides[side], args.n, args.concurrency, args.dsn):
                line.update(side=side, worktree=sides[side], run=rnd)
                got[(side, rnd, line["concurrency"])] = line
                print(json.dumps(line), flush=True)
    for c in [int(x) for x in args.concurrency.split(",")]:
        rounds = [r for r in range(1, args.rounds + 1) if ("a", r, c) in got and ("b", r, c) in got]
        ratios = [got[("b", r, c)]["jobs_per_s"] / got[("a", r, c)]["jobs_per_s"] for r in rounds]

        def med(side: str, key: str) -> float | None:
            vals = [got[(side, r, c)][key] for r in rounds if isinstance(got[(side, r, c)].get(key), (int, float))]
            return round(statistics.median(vals), 3) if vals else None

        print(json.dumps({
            "workload": "ab_ratio", "concurrency": c, "n": args.n, "rounds": len(rounds),
            "ratio_b_to_a": round(statistics.median(ratios), 3) if ratios else None,
            "ratios": [round(x, 3) for x in ratios],
            "a_jobs_per_s": med("a", "jobs_per_s"), "b_jobs_per_s": med("b", "jobs_per_s"),
            "load1": [max(got[("a", r, c)]["load1"], got[("b", r, c)]["load1"]) for r in rounds],
            "a_round_trips_per_job": med("a", "round_trips_per_job"),
            "b_round_trips_per_job": med("b", "round_trips_per_job"),
            "a_commits_per_job": med("a", "commits_per_job"), "b_commits_per_job": med("b", "commits_per_job"),
            "a_cpu_us_per_job": med("a", "client_cpu_us_per_job"), "b_cpu_us_per_job": med("b", "client_cpu_us_per_job"),
            "a": sides["a"], "b": sides["b"],
            "at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }), flush=True)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Markdown table of the median lines in ``bench/run.py`` outputs.

Usage: ``python bench/table.py results/*.jsonl``
"""
from __future__ import annotations

import json
import sys


def main(paths: list[str]) -> None:
    print("| workload | C | figure | p50 / p90 / p99 / max ms | CPU µs/job | rounds | load1 | at (UTC) |")
    print("|---|---|---|---|---|---|---|---|")
    for path in paths:
        for line in open(path):
            d = json.loads(line)
            if d.get("run") != "median":
                continue
            name = d["workload"]
            for extra in ("endpoint", "mode", "plan_cache_mode"):
                if d.get(extra) not in (None, "-"):
                    name += f" {d[extra]}"
            if d.get("history_rows"):
                name += f" ({d['history_rows']:,} history rows)"
            if d.get("requests_per_s") is not None:
                figure = f"{d['requests_per_s']:,.0f} req/s, {d.get('errors', 0)} errors"
            elif d.get("jobs_per_s") is not None and d["workload"] != "notify_burst":
                figure = f"{d['jobs_per_s']:,.0f} jobs/s"
            elif d["workload"] == "notify_burst":
                figure = f"{d['jobs_per_s']:,.0f} commits/s, {d.get('notifies_sent')} NOTIFYs"
            else:
                figure = "—"
            if "ratio_to_w3" in d:
                figure += f" (×{d['ratio_to_w3']} of W3)"
            lat = " / ".join(f"{d[k]:.1f}" if isinstance(d.get(k), (int, float)) else "—"
                             for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms"))
            cpu = d.get("client_cpu_us_per_job") or d.get("api_cpu_us_per_request")
            lo, hi = d.get("load1_range", [d.get("load1"), d.get("load1")])
            print(f"| {name} | {d.get('concurrency') or '—'} | {figure} | {lat} | "
                  f"{cpu if cpu is not None else '—'} | {d.get('rounds')} | {lo}–{hi} | {d['at']} |")


if __name__ == "__main__":
    main(sys.argv[1:])

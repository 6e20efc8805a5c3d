#!/usr/bin/env python3
"""Proxmox requests per operation (issue 32 item 7): runs
``tests/integration/proxmox/test_request_budgets.py`` — an in-process z9 stack against the simulator
over HTTPS and a fresh database per operation, each operation done once to warm up and once counted —
and prints, per operation, the requests its job sent (the simulator's request log, by the job's
fencing token ``X-Z9-Lease``), the polls among them (task status, guest-command status, agent
ping: their number follows how long those took), the work requests, the budget the test holds and
the issue's goal; then the load balancer's rest load per minute (one periodic LoadBalancerObserve
costs ``lb_observe`` requests, every ``lb_health_interval_s``, 15 s by default).

Not counted: the executor process's shared ``/cluster/resources`` listing (one per
``resources_snapshot_s`` for every job of the process) and ``/cluster/nextid`` (once per 30 s):
they carry no job's token.

Usage::

    .venv/bin/python bench/pve_requests.py            # one run (~40 s), a table and JSON lines
    .venv/bin/python bench/pve_requests.py --json     # JSON lines only
    Z9_TEST_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres (default), as the tests
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEALTH_INTERVAL_S = 15.0  # Z9_LB_HEALTH_INTERVAL_S's default


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print only the JSON lines")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="z9-pve-requests-") as tmp:
        out = Path(tmp) / "figures.jsonl"
        env = dict(os.environ, Z9_REQUEST_FIGURES=str(out))
        env.setdefault("Z9_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:randomly",
                              "tests/integration/proxmox/test_request_budgets.py"], check=False, cwd=ROOT, env=env,
                             capture_output=True, text=True)
        lines = [json.loads(x) for x in out.read_text().splitlines()] if out.exists() else []
    if run.returncode != 0:
        print(run.stdout[-4000:], run.stderr[-2000:], file=sys.stderr)
    for d in lines:
        if not args.json:
            d.pop("by_path", None)
        print(json.dumps(d))
    if not args.json and lines:
        print(f"\n{'operation':<22}{'requests':>9}{'polls':>7}{'work':>6}{'budget':>8}{'goal':>6}")
        for d in lines:
            print(f"{d['operation']:<22}{d['requests']:>9}{d['polls']:>7}{d['work']:>6}{d['budget_work']:>8}"
                  f"{d['goal'] if d['goal'] is not None else '-':>6}")
        observe = next((d for d in lines if d["operation"] == "lb_observe"), None)
        if observe:
            print(f"\na load balancer at rest: {observe['requests']} requests per observe × "
                  f"{60 / HEALTH_INTERVAL_S:g} a minute = {observe['requests'] * 60 / HEALTH_INTERVAL_S:g} "
                  "requests per minute (lb-small; an lb-ha reads both appliances)")
    return run.returncode


if __name__ == "__main__":
    sys.exit(main())

"""The failover of issue 13 §1, long form: a primary and a synchronous standby built from Debian's
PostgreSQL (``tests/pgcluster.py``), real ``z9`` processes (api, scheduler, reaper, executors)
whose ``Z9_DATABASE_URL`` names both hosts with ``target_session_attrs=read-write``, server creates
submitted before and after the primary is SIGKILLed (postmaster and backends) and the standby
promoted. The scenario is ``tests/failover_scenario.py`` (the suite runs it reduced in
``tests/acceptance/test_ha.py``).

Prints one JSON line: jobs accepted, jobs lost (must be 0), jobs run twice at once (0), committed
rows that disappeared (0), servers without exactly one VM (0), clone tasks beyond one per server
(0), seconds from the kill until every
listening service has its LISTEN on the new primary, and until the first job submitted after the
kill succeeded.

    .venv/bin/python bench/failover.py --before 200 --after 100 --executors 4

Seconds depend on the machine (promotion itself, backoff of the services' reconnects): take them
on a quiet one. Exit status 1 when a correctness figure is not 0.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from z9.common.settings import RegionSettings, Settings  # noqa: E402
from z9.sim.server import SimConfig, start_simulator  # noqa: E402

from tests import failover_scenario  # noqa: E402
from tests.support import REGION, SimAdmin  # noqa: E402


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=int, default=200, help="creates submitted before the kill")
    ap.add_argument("--after", type=int, default=100, help="creates submitted after the kill")
    ap.add_argument("--executors", type=int, default=4)
    ap.add_argument("--clone-s", type=float, default=2.0, help="simulated clone duration")
    ap.add_argument("--timeout-s", type=float, default=900)
    args = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="z9-failover-bench-"))
    sim_server = await start_simulator(SimConfig(region=REGION, task_default_s=0.05, stats_lag_s=0.5),
                                       cert_dir=workdir / "sim-cert")
    try:
        settings = Settings(regions={REGION: RegionSettings(
            url=sim_server.url, token_id=sim_server.token_id, token_secret=sim_server.token_secret,
            verify_ssl=str(sim_server.cert_path), images=["debian-12"])})
        fig = await failover_scenario.run(workdir, settings, SimAdmin(sim_server), before=args.before,
                                          after=args.after, executors=args.executors, clone_s=args.clone_s,
                                          timeout_s=args.timeout_s)
    finally:
        await sim_server.stop()
    out = asdict(fig)
    out["detail"] = [d for d in out["detail"] if d][:5]
    print(json.dumps({"lib": "z9", "workload": "failover", "executors": args.executors, **out}), flush=True)
    bad = fig.jobs_lost or fig.jobs_run_twice_at_once or fig.committed_rows_disappeared \
        or fig.servers_without_exactly_one_vm or fig.duplicate_clones
    print(f"service logs: {workdir}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))

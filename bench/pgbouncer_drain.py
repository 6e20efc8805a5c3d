"""W3 drain(C) through PgBouncer in transaction mode against direct (issue 13 §2).

Same database, same executor child (``bench/executor_child.py``), rounds alternated: direct
(``Z9_DATABASE_URL`` = the server) and pooled (``Z9_DATABASE_URL`` = a PgBouncer 1.18 this script
starts in transaction mode, ``Z9_DATABASE_POOLER=transaction``: ``statement_cache_size=0``, no
``plan_cache_mode`` startup parameter — the bench database gets ``ALTER DATABASE … SET
plan_cache_mode = force_custom_plan`` instead — and the LISTEN connection direct through
``Z9_DATABASE_DIRECT_URL``). Prints one JSON line per round and the medians with the ratio
pooled/direct.

    .venv/bin/python bench/pgbouncer_drain.py --rounds 5 --n 20000 --concurrency 16

Needs ``pgbouncer`` (Debian package) and an admin DSN (``--dsn``; creates and drops a
``z9_bench_*`` database). Figures need a quiet machine.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys

import asyncpg

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import run  # noqa: E402

from tests.pgcluster import PgBouncer  # noqa: E402


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dsn", default=os.environ.get("Z9_BENCH_DSN", run.DEFAULT_DSN))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--server-pool", type=int, default=0,
                    help="PgBouncer default_pool_size (default: the executor's pool size, concurrency + 4)")
    args = ap.parse_args()
    await run.server_info(args.dsn)
    async with run.BenchDB(args.dsn) as db:
        conn = await asyncpg.connect(db.dsn)
        try:
            await conn.execute(f'ALTER DATABASE "{db.name}" SET plan_cache_mode = force_custom_plan')
            port = int(await conn.fetchval("SHOW port"))
            host = await conn.fetchval("SELECT host(inet_server_addr())") or (
                await conn.fetchval("SHOW unix_socket_directories")).split(",")[0].strip()
        finally:
            await conn.close()
        bouncer = PgBouncer(host=host, port=port, dbname=db.name,
                            default_pool_size=args.server_pool or args.concurrency + 4).start()
        print(json.dumps({"lib": "z9", "workload": "pgbouncer", "version": "1.18 (Debian)",
                          "pool_mode": "transaction", "default_pool_size": args.server_pool or args.concurrency + 4}),
              flush=True)
        results: dict[str, list[dict]] = {"direct": [], "pgbouncer": []}
        try:
            for r in range(1, args.rounds + 1):
                for path in ("direct", "pgbouncer"):
                    if path == "pgbouncer":
                        os.environ.update(Z9_DATABASE_DIRECT_URL=db.dsn, Z9_DATABASE_POOLER="transaction")
                        exe_dsn = bouncer.url()
                    else:
                        os.environ.pop("Z9_DATABASE_DIRECT_URL", None)
                        os.environ.pop("Z9_DATABASE_POOLER", None)
                        exe_dsn = db.dsn
                    results[path].append(await run.drain_round(db.dsn, args.n, args.concurrency, r, f"drain_{path}",
                                                               "-", executor_dsn=exe_dsn))
        finally:
            bouncer.stop()
        med = {p: run.emit_median(f"drain_{p}", rs)["jobs_per_s"] for p, rs in results.items()}
        print(json.dumps({"lib": "z9", "workload": "drain_pgbouncer_vs_direct", "concurrency": args.concurrency,
                          "direct_jobs_per_s": med["direct"], "pgbouncer_jobs_per_s": med["pgbouncer"],
                          "ratio": round(med["pgbouncer"] / med["direct"], 3),
                          "cpu_us_per_job_direct": statistics.median(x["client_cpu_us_per_job"] for x in results["direct"]),
                          "cpu_us_per_job_pgbouncer": statistics.median(
                              x["client_cpu_us_per_job"] for x in results["pgbouncer"])}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())

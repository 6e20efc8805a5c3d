"""Benchmark: the scheduler's job-metrics queries on a large job table.

Creates its own database ``z9_bench_<hex>`` on ``Z9_BENCH_DATABASE_URL`` (or
``Z9_TEST_DATABASE_URL``), migrates it, fills ``--rows`` jobs (mostly finished, some pending,
running and retry, over several kinds and regions), vacuums it, prints ``EXPLAIN (ANALYZE,
BUFFERS)`` and the median time of ``job_count_by_status`` and ``job_oldest_pending_age``, and
drops the database.

    Z9_BENCH_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres \\
        .venv/bin/python bench/job_metrics_queries.py --rows 1000000
"""
from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import time

import asyncpg

from z9.common.sql import q
from z9.db import migrate

FILL = """
INSERT INTO jobs (id, kind, region, resource_type, resource_id, status, attempt, run_after,
                  lease_owner, lease_expires_at, error, created_at, finished_at)
SELECT 'job_' || lpad(to_hex(i), 26, '0'),
       (ARRAY['ServerCreate', 'ServerStop', 'ServerStart', 'ServerDelete'])[1 + i % 4],
       (ARRAY['dev-1', 'eu-1', 'us-1'])[1 + i % 3],
       'server', 'srv_' || lpad(to_hex(i / 3), 26, '0'),
       st, 1,
       now() - make_interval(secs => ($1 - i) / 10.0),
       CASE WHEN st = 'running' THEN 'bench' END,
       CASE WHEN st = 'running' THEN now() + interval '1 hour' END,
       CASE WHEN st = 'failed' THEN '{"class": "permanent", "message": "bench"}'::jsonb END,
       now() - make_interval(secs => ($1 - i) / 10.0),
       CASE WHEN st IN ('succeeded', 'failed') THEN now() END
FROM generate_series(1, $1) AS i,
     LATERAL (SELECT CASE WHEN i > $1 - 200 THEN 'pending'
                          WHEN i > $1 - 300 THEN 'running'
                          WHEN i > $1 - 400 THEN 'retry'
                          WHEN i % 50 = 0 THEN 'failed'
                          ELSE 'succeeded' END::job_status AS st) s
"""


async def timed(conn: asyncpg.Connection, sql: str, *args: object, n: int = 20) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        await conn.fetch(sql, *args)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


async def main(rows: int) -> None:
    base = os.environ.get("Z9_BENCH_DATABASE_URL") or os.environ["Z9_TEST_DATABASE_URL"]
    name = f"z9_bench_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(base)
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        conn = await asyncpg.connect(base.rsplit("/", 1)[0] + "/" + name)
        try:
            await migrate(conn)
            t = time.perf_counter()
            await conn.execute(FILL, rows)
            await conn.execute("VACUUM ANALYZE jobs")
            print(f"filled {rows} jobs in {time.perf_counter() - t:.1f}s")
            regions = ["dev-1", "eu-1", "us-1"]
            for label, sql, args in (("job_count_by_status (live)", q("job_count_by_status"),
                                      (["pending", "running", "retry"],)),
                                     ("job_count_by_status (finished)", q("job_count_by_status"),
                                      (["succeeded", "failed"],)),
                                     ("job_oldest_pending_age", q("job_oldest_pending_age"), (regions, None))):
                plan = await conn.fetch("EXPLAIN (ANALYZE, BUFFERS) " + sql, *args)
                print(f"\n-- {label}\n" + "\n".join(r[0] for r in plan))
                print(f"median of 20 runs: {await timed(conn, sql, *args) * 1000:.1f} ms")
        finally:
            await conn.close()
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    asyncio.run(main(p.parse_args().rows))

"""Migration 0014 (the jobs table's one-column checks as domains) applied by ``z9 migrate`` while
the real services run on a database at version 13 with jobs in every state: every job still
succeeds exactly once, none waits for its lease to expire, and every service carries on by itself."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from z9.common import store
from z9.common.db import connect
from z9.common.settings import Settings
from z9.common.tags import identity_tag
from z9.db import list_migrations

from tests.support import (REGION, Services, SimAdmin, free_port, install_job_log, job_log, make_tenant,
                           overlapping, runs, service_env, wait_until)
from tests.test_engine_fire import FAST, _Client

LEASE_TTL_S = 20.0  # long, so a job stranded under a lease shows as a delay of seconds

# tests.support's job log, reading the row through to_jsonb: a PL/pgSQL function keeps, per
# session, the type each NEW.<field> had when it was first planned, and fails once a column's
# type changes (NEW.attempt: integer, then job_attempt) — the test's own trigger must not.
JOB_LOG_TRIGGER = """
CREATE OR REPLACE FUNCTION test_job_log() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    n jsonb := to_jsonb(NEW);
    o jsonb := CASE WHEN TG_OP = 'UPDATE' THEN to_jsonb(OLD) END;
BEGIN
    IF TG_OP = 'INSERT' OR n->'status' IS DISTINCT FROM o->'status' OR n->'attempt' IS DISTINCT FROM o->'attempt'
       OR n->'lease_owner' IS DISTINCT FROM o->'lease_owner' THEN
        INSERT INTO test_job_log (job_id, resource_id, kind, status, attempt, lease_owner, run_after, error)
        VALUES (n->>'id', n->>'resource_id', n->>'kind', n->>'status', (n->>'attempt')::int, n->>'lease_owner',
                (n->>'run_after')::timestamptz, n->'error');
    END IF;
    RETURN NULL;
END $$;
"""


async def migrate_to(conn: asyncpg.Connection, version: int) -> None:
    """Apply the migrations up to ``version`` as ``z9 migrate`` would."""
    await conn.execute("""CREATE TABLE IF NOT EXISTS schema_migrations (
        version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())""")
    for mig in list_migrations():
        if mig.version <= version:
            async with conn.transaction():
                await conn.execute(mig.sql)
                await conn.execute("INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
                                   mig.version, mig.name)


async def test_a_session_that_finished_and_claimed_before_0014_still_can_after(pg_url: str) -> None:
    """PL/pgSQL plans a function's expressions once per session, each record field with the type it
    had then: jobs_finish_and_claim reads r.attempt (integer until 0014, job_attempt after), so every
    executor connection that used the one-statement path before the migration failed it for good
    ("type of parameter 21 (job_attempt) does not match that when preparing the plan (integer)")
    — unless the migration makes the function be compiled again."""
    from tests.test_migrations import fresh_database

    async with fresh_database(pg_url) as url:
        conn, other = await connect(url), await connect(url)
        try:
            await migrate_to(conn, 13)
            ids = [(await store.job_insert(conn, store.NewJob(kind="Noop", region="r1"))) for _ in range(3)]
            assert len(ids) == 3
            (job,) = await store.job_claim(conn, ["r1"], 1, "ex", 30)
            lost, claimed = await store.job_finish_and_claim(conn, [(store.Lease(job.id, "ex", job.attempt), [])],
                                                             "r1", 1, "ex", 30)
            assert lost == [] and len(claimed) == 1
            await migrate_to_14(other)
            (job,) = claimed
            lost, claimed = await store.job_finish_and_claim(conn, [(store.Lease(job.id, "ex", job.attempt), [])],
                                                             "r1", 1, "ex", 30)
            assert lost == [] and len(claimed) == 1
        finally:
            await conn.close()
            await other.close()


async def migrate_to_14(conn: asyncpg.Connection) -> None:
    from z9.db import migrate

    assert await migrate(conn) == [14]

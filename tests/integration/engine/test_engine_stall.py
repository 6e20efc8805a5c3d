"""No single stuck transaction stalls the executor (issue 14).

Reproduces the stall seen in production: a process frozen (SIGSTOP) inside a transaction that
holds the row lock a job's ``record`` needs (an API process inside a DELETE's transaction,
holding the resource row). Before, the executor's batched finish waited on that lock with no
bound: the whole batch, every later finish and the claims behind them stalled, the finished job
was no longer heartbeated, and 0 of 12 unrelated creates succeeded in 90 s. Now the finish gives
up after ``lock_timeout``, the others finish on their own at once, the executor keeps claiming,
and the blocked job keeps its lease (heartbeats skip the row, never wait on it) until the lock
goes away — then it finishes too.
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from typing import Any

import asyncpg
import pytest

from z9.common import store
from z9.common.db import connect, session_bounds
from z9.common.settings import Settings
from z9.common.store import NewJob
from z9.executor import jobs as job_kinds
from z9.executor.worker import Executor

from tests.support import wait_until, waiting_on_a_lock

FROZEN = r"""
import asyncio, os, signal, sys
import asyncpg

async def main():
    conn = await asyncpg.connect(sys.argv[1], server_settings=dict(a.split("=", 1) for a in sys.argv[3:]))
    tr = conn.transaction()
    await tr.start()
    await conn.execute("UPDATE stall_rows SET n = n WHERE id = $1", sys.argv[2])  # the row lock
    print("locked", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)  # frozen inside the transaction
    try:
        await tr.rollback()
    finally:
        await conn.close()

asyncio.run(main())
"""


class _Recorder:
    """A job kind whose ``record`` updates its resource's row in ``stall_rows`` (as a server
    job's record updates the server row), inside the finish transaction."""

    KIND = "StallProbe"

    async def observe(self, ctx: Any) -> None:
        return None

    def plan(self, job: Any, world: Any) -> list[Any]:
        return []

    async def apply(self, ctx: Any, world: Any, step: Any) -> None:
        return None

    async def verify(self, ctx: Any) -> None:
        return None

    async def record(self, conn: Any, ctx: Any, observed: Any) -> None:
        await conn.execute("UPDATE stall_rows SET n = n + 1 WHERE id = $1", ctx.job.resource_id)

    async def record_failure(self, conn: Any, ctx: Any, error: dict[str, Any]) -> None:
        return None


class _NoClient:
    def close(self) -> None:
        return None


@pytest.fixture
def recorder() -> Any:
    k = _Recorder()
    job_kinds.register(k)
    yield k
    job_kinds.REGISTRY.pop(_Recorder.KIND, None)


def _freeze_holding(db_url: str, row: str, *settings: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", FROZEN, db_url, row, *settings], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc


async def _status_is(pool: asyncpg.Pool, job_id: str, status: str) -> bool:
    return (await _statuses(pool, [job_id]))[job_id] == status


async def _statuses(pool: asyncpg.Pool, ids: list[str]) -> dict[str, str]:
    return {r["id"]: r["status"] for r in await pool.fetch("SELECT id, status FROM jobs WHERE id = ANY($1)", ids)}


async def test_a_frozen_transaction_holding_a_row_lock_does_not_stall_other_jobs(
        pool: asyncpg.Pool, db_url: str, recorder: _Recorder) -> None:
    await pool.execute("CREATE TABLE stall_rows (id text PRIMARY KEY, n int NOT NULL DEFAULT 0)")
    await pool.execute("INSERT INTO stall_rows (id) SELECT 'srv_' || i FROM generate_series(0, 12) i")

    async def enqueue(resource: str) -> str:
        return (await store.job_insert(pool, NewJob(kind=_Recorder.KIND, region="r1", resource_type="server",
                                                    resource_id=resource, max_attempts=3))).id

    blocked = await enqueue("srv_0")
    frozen = _freeze_holding(db_url, "srv_0", "idle_in_transaction_session_timeout=0")  # worst case: no bound
    settings = Settings(database_url=db_url, executor_concurrency=4, poll_interval_s=0.5, regions={},
                        lease_ttl_s=3.0, heartbeat_s=0.5, executor_db_lock_timeout_s=0.5)
    ex = Executor(settings, ["r1"], client_factory=lambda r: _NoClient())  # type: ignore[arg-type,return-value]
    task = asyncio.create_task(ex.run())
    try:
        # The blocked job runs and reaches its finish first; then twelve unrelated jobs arrive.
        await wait_until(lambda: _status_is(pool, blocked, "running"), 15, "the first job claimed")

        async def finish_blocked() -> bool:  # its record waits on the frozen row lock (or gave up once already)
            return (ex.finisher is not None and ex.finisher.blocked_retries >= 1) or await waiting_on_a_lock(pool)
        await wait_until(finish_blocked, 15, "the first job's finish to run into the frozen row lock")
        t0 = time.monotonic()
        others = [await enqueue(f"srv_{i}") for i in range(1, 13)]
        async def unrelated_done() -> bool:
            return all(s == "succeeded" for s in (await _statuses(pool, others)).values())
        await wait_until(unrelated_done, 10, "the unrelated jobs to succeed (not stalled behind one lock)")
        unrelated_s = time.monotonic() - t0
        # The blocked job is done but unrecorded: still running, its lease kept alive well past
        # the lease TTL (3 s) by the heartbeat, which skips its locked row rather than wait.
        await asyncio.sleep(4.0)
        row = await pool.fetchrow("SELECT status, lease_owner, lease_expires_at > now() AS valid FROM jobs WHERE id = $1",
                                  blocked)
        assert (row["status"], row["lease_owner"], row["valid"]) == ("running", ex.owner, True)
        assert await store.lease_reclaim_expired(pool) == []
        assert ex.finisher is not None and ex.finisher.blocked_retries >= 2
        # The frozen process resumes and rolls back: the blocked job finishes too.
        frozen.send_signal(signal.SIGCONT)
        await wait_until(lambda: _status_is(pool, blocked, "succeeded"), 15,
                         "the blocked job to finish after the lock went away")
        assert await pool.fetchval("SELECT n FROM stall_rows WHERE id = 'srv_0'") == 1  # recorded once
        assert unrelated_s < 10
    finally:
        if frozen.poll() is None:
            frozen.send_signal(signal.SIGCONT)
            frozen.kill()
        frozen.wait(10)
        ex.stop()
        await task
    assert not ex.inflight and ex._reserved == 0


async def test_z9_sessions_carry_bounded_waits_and_a_frozen_one_releases_its_locks(
        pool: asyncpg.Pool, db_url: str) -> None:
    settings = Settings(database_url=db_url, regions={}, db_idle_in_transaction_timeout_s=1.0)
    bounds = session_bounds(settings, "api")
    assert bounds["lock_timeout"] == "5000" and bounds["statement_timeout"] == "60000"
    assert bounds["tcp_keepalives_idle"] == "30" and bounds["tcp_keepalives_count"] == "3"
    # The executor's own pool connections carry its bounds.
    ex_pool = await __import__("z9.common.db", fromlist=["create_service_pool"]).create_service_pool(
        settings, application_name="z9-executor")
    try:
        got = await ex_pool.fetchrow("SELECT current_setting('lock_timeout') AS l, "
                                     "current_setting('idle_in_transaction_session_timeout') AS i")
        assert (got["l"], got["i"]) == ("2s", "1s")
    finally:
        await ex_pool.close()
    # An API process frozen inside its transaction: PostgreSQL ends its session after the idle
    # timeout, and the row it held is free again.
    await pool.execute("CREATE TABLE stall_rows (id text PRIMARY KEY, n int NOT NULL DEFAULT 0)")
    await pool.execute("INSERT INTO stall_rows (id) VALUES ('srv_x')")
    frozen = _freeze_holding(db_url, "srv_x", *(f"{k}={v}" for k, v in bounds.items()))
    try:
        conn = await connect(db_url)
        try:
            t0 = time.monotonic()
            await conn.execute("SET lock_timeout = '10s'")
            await conn.execute("UPDATE stall_rows SET n = n + 1 WHERE id = 'srv_x'")
            assert time.monotonic() - t0 < 5
        finally:
            await conn.close()
    finally:
        frozen.send_signal(signal.SIGCONT)
        frozen.wait(10)


async def test_an_api_request_waiting_on_a_frozen_lock_answers_503_busy(settings: Settings, db_url: str) -> None:
    from tests.support import api_stack
    from z9.common.db import create_service_pool

    s = settings.model_copy(update={"api_db_lock_timeout_s": 0.5})
    api_pool = await create_service_pool(s, application_name="z9-api")  # the API's bounded connections
    try:
        async with api_stack(s, api_pool) as api:
            server, _ = await api.create_server("held-1")
            frozen = _freeze_holding_server(db_url, server["id"])
            try:
                t0 = time.monotonic()
                status, body = await api.call("DELETE", f"/servers/{server['id']}")
                assert status == 503 and body["error"]["code"] == "busy", body
                assert time.monotonic() - t0 < 5
            finally:
                frozen.send_signal(signal.SIGCONT)
                frozen.wait(10)
            status, body = await api.call("DELETE", f"/servers/{server['id']}")  # the lock is gone
            assert status == 202, body
    finally:
        await api_pool.close()


def _freeze_holding_server(db_url: str, server_id: str) -> subprocess.Popen[str]:
    code = FROZEN.replace("UPDATE stall_rows SET n = n WHERE id = $1", "UPDATE servers SET updated_at = now() WHERE id = $1")
    proc = subprocess.Popen([sys.executable, "-c", code, db_url, server_id, "idle_in_transaction_session_timeout=0"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc

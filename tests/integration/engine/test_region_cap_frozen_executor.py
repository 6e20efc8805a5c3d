"""the per-region cap counts running jobs whose lease has not expired, so a frozen
executor's slot (SIGSTOP, a long GC or network stall past the lease TTL) is handed to another
executor at once. But the frozen executor's job is not lost until the scheduler reclaims it: when it
wakes up before that, its heartbeat renews the expired lease (job_heartbeat is fenced on owner and
attempt only), and the region runs cap + 1 jobs — the hypervisor gets more tasks than the operator
allowed, for as long as that job runs. Fixed: an expired lease is lost (job_heartbeat,
job_heartbeat_many), so the woken executor stops at its next heartbeat or fence.
"""
from __future__ import annotations

import asyncpg
import pytest

from z9.common import store
from z9.common.clock import TestClock
from z9.common.errors import LeaseLost
from z9.common.store import Lease

from tests.integration.engine.test_region_cap import TTL, _enqueue


async def _live(pool: asyncpg.Pool, region: str = "r1", now: TestClock | None = None) -> int:
    """Running jobs of ``region`` whose lease has not expired (at ``now``'s time)."""
    return await pool.fetchval("SELECT count(*) FROM jobs WHERE status = 'running' AND region = $1 "
                               "AND lease_expires_at > coalesce($2::timestamptz, now())", region,
                               now.db_now() if now is not None else None)


async def test_a_frozen_executor_that_wakes_up_does_not_push_the_region_over_its_cap(pool: asyncpg.Pool,
                                                                                   clock: TestClock) -> None:
    a, b = await _enqueue(pool, 2)
    caps = {"r1": 1}
    (ja,) = await store.job_claim(pool, ["r1"], 10, "frozen", TTL, caps, now=clock.db_now())
    clock.step(TTL + 1)  # frozen past its lease; the scheduler has not reclaimed yet
    (jb,) = await store.job_claim(pool, ["r1"], 10, "other", TTL, caps, now=clock.db_now())  # the slot was handed on
    try:
        await store.job_heartbeat(pool, Lease(ja.id, "frozen", ja.attempt), TTL, now=clock.db_now())  # it wakes up
    except LeaseLost:
        pass  # the frozen executor stops: the cap holds
    assert await _live(pool, now=clock) <= 1

"""7d78a5e made an expired lease lost for job_heartbeat / job_heartbeat_many, but the other
lease-renewing writes (job_progress: every step_running / step_done / set_plan; job_remember: a
snooze's memo) still renew an expired lease fenced on owner and attempt only. A frozen executor
that wakes up runs ``step_running`` before the step's fence: its progress write resurrects the
lease, the fence then passes, and the region runs cap + 1 jobs — the case break13 closed for the
heartbeat, reopened through the step list.
"""
from __future__ import annotations

import asyncpg
import pytest

from z9.common import store
from z9.common.clock import TestClock
from z9.common.errors import LeaseLost
from z9.common.store import Lease

from tests.integration.engine.test_region_cap_frozen_executor import _live
from tests.integration.engine.test_region_cap import TTL, _enqueue


@pytest.mark.parametrize("write", ["progress", "remember"])
async def test_a_woken_executor_cannot_renew_its_expired_lease_by_another_write(pool: asyncpg.Pool, clock: TestClock,
                                                                                 write: str) -> None:
    a, b = await _enqueue(pool, 2)
    caps = {"r1": 1}
    (ja,) = await store.job_claim(pool, ["r1"], 10, "frozen", TTL, caps, now=clock.db_now())
    clock.step(TTL + 1)  # frozen past its lease; the scheduler has not reclaimed yet
    (jb,) = await store.job_claim(pool, ["r1"], 10, "other", TTL, caps, now=clock.db_now())  # the slot was handed on
    lease = Lease(ja.id, "frozen", ja.attempt)
    with pytest.raises(LeaseLost):  # it wakes up: step_running writes its steps, or a snooze its memo
        if write == "progress":
            await store.job_progress(pool, lease, [], TTL, now=clock.db_now())
        else:
            await store.job_remember(pool, lease, {"x": 1}, TTL, now=clock.db_now())
    with pytest.raises(LeaseLost):  # and its fence before the hypervisor call stops it
        await store.job_heartbeat(pool, lease, TTL, now=clock.db_now())
    assert await _live(pool, now=clock) <= 1


async def test_an_unexpired_lease_is_still_renewed_by_progress(pool: asyncpg.Pool, clock: TestClock) -> None:
    (a,) = await _enqueue(pool, 1)
    (ja,) = await store.job_claim(pool, ["r1"], 10, "me", 0.5, {}, now=clock.db_now())
    lease = Lease(ja.id, "me", ja.attempt)
    await store.job_progress(pool, lease, [], TTL, now=clock.db_now())
    await store.job_remember(pool, lease, {"x": 1}, TTL, now=clock.db_now())
    clock.step(0.6)  # past the claim's lease
    await store.job_heartbeat(pool, lease, TTL, now=clock.db_now())  # renewed to TTL by the writes above

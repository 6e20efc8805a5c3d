"""The API's fast paths: the token cache (a revoked token stops working once its entry
expires; unknown tokens are never remembered) and the one-statement create (server and job
written together or not at all), with the job's NOTIFY sent after commit."""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

import asyncpg
import pytest

from z9.common.clock import TestClock
from z9.common.settings import Settings

from tests.support import REGION, Stack, api_stack


@pytest.fixture
async def api_cached(settings: Settings, pool: asyncpg.Pool, clock: TestClock) -> AsyncIterator[Stack]:
    """The API with a 0.5 s token cache, reading time through the test's clock."""
    async with api_stack(settings.model_copy(update={"api_token_cache_s": 0.5}), pool, clock=clock) as stack:
        yield stack


async def test_revoked_token_stops_working_when_its_cache_entry_expires(api_cached: Stack, clock: TestClock) -> None:
    api = api_cached
    clock.pin()  # the cache's 0.5 s pass only when the test says so
    assert (await api.call("GET", "/servers"))[0] == 200  # remembered now
    await api.pool.execute("UPDATE api_tokens SET revoked_at = now()")
    assert (await api.call("GET", "/servers"))[0] == 200  # within the cache's 0.5 s
    clock.step(0.6)
    status, out = await api.call("GET", "/servers")
    assert status == 401, out


async def test_unknown_tokens_are_not_remembered(api_cached: Stack) -> None:
    api = api_cached
    assert (await api.call("GET", "/servers", token="z9t_unknown"))[0] == 401
    # the token becomes known: it works at once (no negative cache)
    from z9.common import store

    await store.api_token_insert(api.pool, api.tenant_id, "z9t_unknown")
    assert (await api.call("GET", "/servers", token="z9t_unknown"))[0] == 200


async def _counts(pool: asyncpg.Pool) -> tuple[int, int]:
    return (await pool.fetchval("SELECT count(*) FROM servers"), await pool.fetchval("SELECT count(*) FROM jobs"))


@pytest.mark.parametrize("idempotency_key", [None, "k-1"])
async def test_create_writes_server_and_job_together_and_notifies(api: Stack, idempotency_key: Any) -> None:
    got: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(api.settings.database_url)
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
    body = {"name": "web-1", "region": REGION, "image": "debian-12", "cores": 1, "memory_mib": 512, "disk_gib": 1}
    try:
        await listener.add_listener("z9_jobs", lambda _c, _pid, _ch, payload: got.put_nowait(payload))
        status, out = await api.call("POST", "/servers", json=body, headers=headers)
        assert status == 202, out
        job = await api.pool.fetchrow("SELECT * FROM jobs WHERE id = $1", out["job"]["id"])
        assert out["job"] == {"id": job["id"], "kind": "ServerCreate", "status": "pending"}
        assert (job["resource_id"], job["resource_type"], job["region"], job["tenant_id"]) == (
            out["server"]["id"], "server", REGION, api.tenant_id)
        assert job["args"]["name"] == "web-1" and job["max_attempts"] == api.settings.max_attempts
        assert await asyncio.wait_for(got.get(), 5) == REGION
        # a duplicate name: 409, and neither a server nor a job is written, nobody notified
        status, out = await api.call("POST", "/servers", json=body)
        assert status == 409, out
        assert await _counts(api.pool) == (1, 1)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(got.get(), 0.3)
    finally:
        await listener.close()

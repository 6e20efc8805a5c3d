"""AddressDelete: the final delete of an address (its buffer expired: the reaper enqueued it).

observe  as AddressUnassign: every VM tagged ``z9-addr-<id>``, wherever the database thinks it is.
plan     (pure) per holder: remove_entry, untag (normally nothing: the buffer's AddressUnassign did it).
apply    one idempotent step at a time (see ``_address``).
verify   observe again: no VM carries the address.
record   in the finishing transaction: ``destroying`` → ``deleted``, and the IP goes back to its
         pool quarantined for the pool's ``quarantine_s`` (1 h by default): it is not handed out
         again before that, whatever a cache or a guest still remembers of it.
"""
from __future__ import annotations

from typing import Any

import asyncpg

from z9.common.models import Job

from z9.executor.context import JobContext, Step
from z9.resources.address.jobs import shared as _address
from z9.resources.address import store as address_store
from z9.resources.address import ADDRESS_DELETE

KIND = ADDRESS_DELETE


async def observe(ctx: JobContext) -> _address.World:
    return await _address.observe(ctx, None)


def plan(job: Job, world: _address.World) -> list[Step]:
    return _address.plan(job, world)


async def apply(ctx: JobContext, world: _address.World, step: Step) -> None:
    await _address.apply(ctx, world, step)


async def verify(ctx: JobContext) -> dict[str, Any]:
    return await _address.verify(ctx, None)


async def record(conn: asyncpg.Connection, ctx: JobContext, observed: dict[str, Any]) -> None:
    await address_store.address_deleted(conn, ctx.job.resource_id, observed)


record_failure = _address.record_failure

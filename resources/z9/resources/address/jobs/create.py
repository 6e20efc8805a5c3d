"""AddressCreate: a new address on no server (``POST /v1/addresses`` without ``server_id``; with
one, the create's job is an AddressAssign). It makes sure no VM carries the address and looks for
foreign VMs already using the IP, which it reports on the address (never touching them).

observe / plan / apply / verify: as AddressUnassign (``_address`` with no wanted server); the
address turns ``active``.
"""
from __future__ import annotations

from typing import Any

import asyncpg

from z9.common.models import Job

from z9.executor.context import JobContext, Step
from z9.resources.address.jobs import shared as _address
from z9.resources.address import ADDRESS_CREATE

KIND = ADDRESS_CREATE


async def observe(ctx: JobContext) -> _address.World:
    return await _address.observe(ctx, None)


def plan(job: Job, world: _address.World) -> list[Step]:
    return _address.plan(job, world)


async def apply(ctx: JobContext, world: _address.World, step: Step) -> None:
    await _address.apply(ctx, world, step)


async def verify(ctx: JobContext) -> dict[str, Any]:
    return await _address.verify(ctx, None)


async def record(conn: asyncpg.Connection, ctx: JobContext, observed: dict[str, Any]) -> None:
    await _address.record(conn, ctx, observed)


record_failure = _address.record_failure

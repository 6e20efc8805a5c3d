"""AddressUnassign: take an address off every VM (also the first phase of its deletion: the
address stops routing during the buffer; a cancellation assigns it back).

observe  the address and every VM tagged ``z9-addr-<id>`` across the cluster (whatever the
         database thinks holds it), foreign VMs using the IP.
plan     (pure) per holder: (a primary, with a private network) add_private_entry, remove_entry,
         (a primary) clear_ipconfig — to its private address, else DHCP and disable_ipfilter —, then untag.
apply    one idempotent step at a time (see ``_address``).
verify   observe again: no VM carries the tag; records it (``observed.holder`` null).
"""
from __future__ import annotations

from typing import Any

import asyncpg

from z9.common.models import Job

from z9.executor.context import JobContext, Step
from z9.resources.address.jobs import shared as _address
from z9.resources.address import ADDRESS_UNASSIGN

KIND = ADDRESS_UNASSIGN


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

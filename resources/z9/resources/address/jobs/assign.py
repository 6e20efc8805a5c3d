"""AddressAssign: put an address on one server's VM, taking it off any other (a move).

observe  the address, every VM tagged ``z9-addr-<id>`` across the cluster, the server's VM (by
         ``z9-id-<server>``), its IP set ``ipfilter-net0`` and firewall options, foreign VMs
         using the IP.
plan     (pure) old holders: remove_entry, untag; the server's VM: tag, create_ipset,
         add_entry, set_ipconfig (primary, stopped VM only), enable_ipfilter (when enforced).
apply    one idempotent step at a time (see ``_address``).
verify   observe again: exactly the server's VM carries the tag and the entry; records it.

Lock keys: the address (its resource) and the server (``extra_lock_keys``), so it runs after
every earlier job of either — the server's create among them.
"""
from __future__ import annotations

from typing import Any

import asyncpg

from z9.common.models import Job

from z9.executor.context import JobContext, Step
from z9.resources.address.jobs import shared as _address
from z9.resources.address import ADDRESS_ASSIGN

KIND = ADDRESS_ASSIGN


async def observe(ctx: JobContext) -> _address.World:
    return await _address.observe(ctx, ctx.args["server_id"])


def plan(job: Job, world: _address.World) -> list[Step]:
    return _address.plan(job, world)


async def apply(ctx: JobContext, world: _address.World, step: Step) -> None:
    await _address.apply(ctx, world, step)


async def verify(ctx: JobContext) -> dict[str, Any]:
    return await _address.verify(ctx, ctx.args["server_id"])


async def record(conn: asyncpg.Connection, ctx: JobContext, observed: dict[str, Any]) -> None:
    await _address.record(conn, ctx, observed)


record_failure = _address.record_failure
